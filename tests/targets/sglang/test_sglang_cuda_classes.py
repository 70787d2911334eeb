"""One deployment of each class SGLang 0.5.23 resolves on a CUDA host (issue 39), planned and
held to the figures SGLang's own code gave for it: references/sglang_reference.py with its
platform queries answered as a CUDA GPU of the case's compute capability (SM90 unless the case
names one), `python references/sglang_diff.py --cases ...` agreeing field by field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import report_for_case
from support import paths

FIXTURES = paths.HF_CONFIGS
MEMORY = {"available_bytes": 8_000_000_000}
H200_TOTAL = 143771 << 20


def fixture(name: str, **update: Any) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((FIXTURES / name / "config.json").read_text())
    config.update(update)
    return config


def case(config: dict[str, Any], *, gpu: dict[str, Any] | None = None,
         memory: dict[str, Any] | None = None, **server_args: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"config": config, "server_args": server_args,
                             "memory": MEMORY if memory is None else memory}
    if gpu is not None:
        found["gpu"] = gpu
    return found


def figures(report: dict[str, Any]) -> tuple[Any, ...]:
    assert "error" not in report, report.get("error")
    return (report["page_size"], report["max_total_num_tokens"],
            report["max_running_requests"], report["cell_size_bytes"])


def pool(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in report["pools"] if p["name"] == name)
    return found


QWEN3_NEXT = "qwen3-next-80b-a3b-instruct"
MTP: dict[str, Any] = {
    "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "@model",
    "speculative_eagle_topk": 1, "speculative_num_steps": 2, "speculative_num_draft_tokens": 3}


def test_sm100_hybrid_linear_attention_pages_by_64() -> None:
    """Qwen3-Next with MTP (top-k 1) on a B200: `_qwen3_5_hybrid_overrides` keeps trtllm_mha
    and its 64-token page; on an H200 the same server pages by 1."""
    args: dict[str, Any] = {"tp_size": 4, "context_length": 4096, "mem_fraction_static": 0.85,
                            **MTP}
    got = report_for_case(case(fixture(QWEN3_NEXT), gpu={"capability": [10, 0]}, **args))
    assert figures(got) == (64, 316_544, 24, 13_312)
    assert pool(got, "mamba_conv0")["tokens"] == 120
    assert got["req_to_token"]["shape"] == [25, 4165]
    hopper = report_for_case(case(fixture(QWEN3_NEXT), gpu={"capability": [9, 0]}, **args))
    assert hopper["page_size"] == 1


def test_sm100_hybrid_override_sets_the_page_over_a_given_one() -> None:
    """On SM100 the radix cache on without drafts leaves triton, whose page (1) the override
    sets over the 16 given; with the radix cache off trtllm_mha's 64."""
    args: dict[str, Any] = {"tp_size": 4, "context_length": 4096, "mem_fraction_static": 0.85,
                            "page_size": 16}
    blackwell = {"capability": [10, 0]}
    assert report_for_case(case(fixture(QWEN3_NEXT), gpu=blackwell, **args))["page_size"] == 1
    off = report_for_case(case(fixture(QWEN3_NEXT), gpu=blackwell, disable_radix_cache=True,
                               **args))
    assert off["page_size"] == 64


DSV32 = fixture("deepseek-v3.2-exp", num_hidden_layers=6)
DSV32_ARGS: dict[str, Any] = {"tp_size": 8, "context_length": 4096,
                              "mem_fraction_static": 0.85, "kv_cache_dtype": "fp8_e4m3"}


def test_dcp_runs_trtllm_dsa_backends_with_raw_rows() -> None:
    """DCP 2 with no DSA backend given: `_dsa_dcp_overrides` sets trtllm for both, so the fp8
    latent rows are the raw 576 bytes, not flashmla_kv's packed 656."""
    got = report_for_case(case(DSV32, dcp_size=2, **DSV32_ARGS))
    assert figures(got) == (64, 1_587_264, 4096, 5040)
    assert pool(got, "kv")["buffers"][0]["shape"] == [1_587_328, 1, 576]
    assert pool(got, "index")["tokens"] == 3_174_592


def test_a_dsa_page_is_rewritten_to_64() -> None:
    """page_size 16 on DeepSeek-V3.2: SGLang sets 64 (with a warning), so the plan is its."""
    got = report_for_case(case(DSV32, page_size=16, **DSV32_ARGS))
    assert figures(got) == (64, 1_692_032, 4096, 4728)
    assert pool(got, "kv")["buffers"][0]["shape"] == [1_692_096, 1, 656]


def test_gemma3_context_is_unscaled_under_transformers_5() -> None:
    """No context_length given: transformers 5 keys Gemma-3's rope parameters by layer type, so
    get_context_length finds no factor and takes max_position_embeddings, 131,072."""
    config = fixture("gemma-3-27b-it")
    config["text_config"]["num_hidden_layers"] = 6
    got = report_for_case(case(config, tp_size=2, mem_fraction_static=0.85,
                               max_running_requests=8))
    assert figures(got) == (1, 325_520, 8, 24_576)
    assert got["req_to_token"]["shape"] == [9, 131_076]


def eagle3_case(**server_args: Any) -> dict[str, Any]:
    target = fixture("llama-3.1-8b-instruct")
    draft = fixture("llama-3.1-8b-instruct", architectures=["LlamaForCausalLMEagle3"],
                    num_hidden_layers=1, max_position_embeddings=2048)
    draft.pop("rope_scaling")
    found = case(target, tp_size=1, mem_fraction_static=0.85, speculative_algorithm="EAGLE3",
                 **server_args)
    found["draft_config"] = draft
    return found


@pytest.mark.parametrize(("server_args", "refused"), [
    ({"context_length": 4096}, True),
    ({"context_length": 4096, "allow_overwrite_longer_context_len": True}, False),
    # No context given: SGLang's draft derives its own, nothing to refuse.
    ({"max_running_requests": 8}, False),
])
def test_an_eagle3_draft_shorter_than_the_context(server_args: dict[str, Any],
                                                  refused: bool) -> None:
    """A 2,048-token EAGLE-3 draft under a 4,096-token server: SGLang's draft ModelConfig
    refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set."""
    got = report_for_case(eagle3_case(**server_args))
    assert ("error" in got) is refused
    if refused:
        assert "engine.context_length" in got["error"]
        assert "(2048)" in got["error"]


def test_deepep_mode_normal_leaves_the_default_fraction() -> None:
    """`--deepep-mode normal` turns SGLang's graphs off after its default fraction was
    resolved: gpt-oss on an H200 keeps 0.873 and SGLang's 119,503,169 tokens."""
    config = fixture("gpt-oss-120b", num_hidden_layers=4)
    config["layer_types"] = config["layer_types"][:4]
    memory = {"pre_model_load_free_bytes": H200_TOTAL,
              "post_weights_free_bytes": H200_TOTAL - 20 * (1 << 30)}
    got = report_for_case(case(config, gpu={"total_memory_bytes": H200_TOTAL,
                                            "name": "NVIDIA H200"},
                               memory=memory, tp_size=8, context_length=4096,
                               moe_a2a_backend="deepep", deepep_mode="normal"))
    assert figures(got)[:3] == (1, 119_503_169, 4096)


def test_overlap_schedule_off_keeps_three_mamba_slots_a_request() -> None:
    """`--disable-overlap-schedule` on 1-token pages: SGLang's Mamba radix cache takes the
    no_buffer strategy, 3 slots a running request (195 slots, 65 requests)."""
    got = report_for_case(case(fixture(QWEN3_NEXT), tp_size=4, context_length=4096,
                               mem_fraction_static=0.85, disable_overlap_schedule=True))
    assert figures(got) == (1, 342_929, 65, 12_288)
    assert pool(got, "mamba_conv0")["tokens"] == 195


def test_qwen3_next_layer_types_sglang_does_not_build_are_refused() -> None:
    """SGLang builds Qwen3-Next by full_attention_interval (layer 3 of each 4 attention); a
    layer_types putting attention at layer 0 is another model than it serves. The same
    layer_types as its interval is planned."""
    types = ["full_attention", "linear_attention", "linear_attention", "linear_attention"] * 2
    config = fixture(QWEN3_NEXT, num_hidden_layers=8, layer_types=types)
    args: dict[str, Any] = {"tp_size": 4, "context_length": 4096, "mem_fraction_static": 0.85}
    got = report_for_case(case(config, **args))
    assert "layer_types[0]" in got["error"]
    assert "full_attention_interval" in got["error"]
    same = fixture(QWEN3_NEXT, num_hidden_layers=8, layer_types=types[1:] + types[:1])
    assert "error" not in report_for_case(case(same, **args))


def test_sm100_override_page_decides_the_mamba_strategy() -> None:
    """Qwen3-Next with EAGLE (no top-k) on a B200, overlap off, page 16 given: the hybrid
    override sets triton's page 1 before SGLang resolves the Mamba radix strategy, which then
    reads that page and takes no_buffer, 3 slots a request (SGLang: 81 slots, 27 requests;
    the given 16 would have made it extra_buffer's 4)."""
    got = report_for_case(case(fixture(QWEN3_NEXT), gpu={"capability": [10, 0]}, tp_size=4,
                               context_length=4096, mem_fraction_static=0.85, page_size=16,
                               disable_overlap_schedule=True, speculative_algorithm="EAGLE",
                               speculative_draft_model_path="@model"))
    assert figures(got) == (1, 319_452, 27, 13_312)
    assert pool(got, "mamba_conv0")["tokens"] == 81
    assert pool(got, "mamba_intermediate_ssm")["tokens"] == 27
