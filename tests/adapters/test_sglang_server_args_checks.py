"""SGLang 0.5.23's own startup checks of server arguments the plan otherwise ignores
(adapters/sglang/server_args_checks.py): each combination SGLang refuses (its messages,
arg_groups/*_hook.py, quoted in the comments) is refused, naming the field, and the
combination SGLang takes is planned. Found by `references/sglang_diff.py
--server-args-fields`, where SGLang refused these cases and the planner did not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import report_for_case, settings_from_server_args
from hisparse_plan.adapters.sglang.server_args_table import UNPLANNED
from hisparse_plan.errors import UnsupportedRequestError
from support import paths

BASE: dict[str, Any] = {"tp_size": 2, "context_length": 4096}
MEMORY = {"available_bytes": 8 << 30}

REFUSED: list[tuple[dict[str, Any], str]] = [
    # "--dcp-comm-backend fi_a2a ... requires --dcp-size ... > 1"
    ({"dcp_comm_backend": "fi_a2a"}, "dcp_comm_backend"),
    ({"dcp_comm_backend": "a2a", "dcp_size": 1}, "dcp_comm_backend"),
    # "--dcp-replicate-q-proj requires --dcp-size > 1."
    ({"dcp_replicate_q_proj": True}, "dcp_replicate_q_proj"),
    ({"dcp_replicate_q_proj": True, "dcp_size": 2, "dcp_comm_backend": "ag_rs"},
     "dcp_replicate_q_proj"),
    # "PP size should be set to 1 under elastic EP"
    ({"elastic_ep_backend": "mooncake", "pp_size": 2}, "elastic_ep_backend"),
    # "--max-ep-size requires --elastic-ep-backend to be set."
    ({"max_ep_size": 8}, "max_ep_size"),
    # "--elastic-ep-join-rank-offset is only valid with --elastic-ep-join-mode scale."
    ({"ep_join_rank_offset": 2}, "ep_join_rank_offset"),
    # "--elastic-ep-initial-size is only valid for an Elastic EP deployment ..."
    ({"elastic_ep_initial_size": 2}, "elastic_ep_initial_size"),
    ({"elastic_ep_initial_size": 2, "elastic_ep_backend": "mooncake", "max_ep_size": 2},
     "elastic_ep_initial_size"),
    # "--elastic-ep-join-mode requires --elastic-ep-backend to be set."
    ({"ep_join_mode": "scale"}, "ep_join_mode"),
    # "--enable-http-worker-reuseport requires --tokenizer-worker-num > 1 ..."
    ({"enable_http_worker_reuseport": True}, "enable_http_worker_reuseport"),
    ({"enable_http_worker_reuseport": True, "tokenizer_worker_num": 2, "enable_http2": True},
     "enable_http_worker_reuseport"),
    # "--speculative-use-block-verification only supports EAGLE / EAGLE3 / NEXTN / ..."
    ({"speculative_use_block_verification": True}, "speculative_use_block_verification"),
    # "--speculative-draft-sink-size requires --speculative-draft-window-size."
    ({"speculative_draft_sink_size": 4}, "speculative_draft_sink_size"),
    # "--prefill-kv-cache-dequant-dtype applies only with --kv-cache-dtype=nvfp4."
    ({"prefill_kv_cache_dequant_dtype": "fp8_e4m3"}, "prefill_kv_cache_dequant_dtype"),
    # "--enable-megamoe-for-layernorm-sp requires --enable-layernorm-sp."
    ({"enable_megamoe_for_layernorm_sp": True}, "enable_megamoe_for_layernorm_sp"),
    # "--enable-linker-mla-dedup requires the Mooncake linker."
    ({"enable_linker_mla_dedup": True}, "enable_linker_mla_dedup"),
    # "quantize_and_serve requires ModelOpt quantization" / NotImplementedError
    ({"quantize_and_serve": True}, "quantize_and_serve"),
    # "--hicache-host-memory-fraction must be in (0, 1]."
    ({"hicache_host_memory_fraction": 1.6}, "hicache_host_memory_fraction"),
    # "attn_cp_size != moe_dp_size is only supported when moe_dp_size == 1"
    ({"moe_dp_size": 2}, "moe_dp_size"),
    # "--flashinfer-a2a-dispatch-type requires --moe-a2a-backend flashinfer."
    ({"flashinfer_a2a_dispatch_type": "mxfp8"}, "flashinfer_a2a_dispatch_type"),
    # parallel_hook.py: `assert resolved_view(server_args).ep_size > 1` (an empty message)
    ({"enable_eplb": True}, "enable_eplb"),
    ({"enable_eplb": True, "moe_a2a_backend": "deepep", "tp_size": 1}, "enable_eplb"),
    # "--ep-dispatch-algorithm lp picks a different physical replica per rank, ..."
    ({"ep_dispatch_algorithm": "lp"}, "ep_dispatch_algorithm"),
    # "--enable-ssl-refresh requires --ssl-certfile and --ssl-keyfile to be specified."
    ({"enable_ssl_refresh": True}, "enable_ssl_refresh"),
    ({"enable_ssl_refresh": True, "ssl_certfile": "c.pem"}, "enable_ssl_refresh"),
    # "--linear-attn-decode-backend flashkda is not supported: FlashKDA is prefill-only."
    ({"linear_attn_decode_backend": "flashkda"}, "linear_attn_decode_backend"),
    # "--enable-tp-lm-head-all-to-all requires attention DP (--attn-dp-size)."
    ({"enable_tp_lm_head_all_to_all": True}, "enable_tp_lm_head_all_to_all"),
    ({"enable_tp_lm_head_all_to_all": True, "tp_size": 4, "dp_size": 2,
      "enable_dp_attention": True}, "enable_tp_lm_head_all_to_all"),
    # "--enable-dp-lm-head requires attention DP (--attn-dp-size)."
    ({"enable_dp_lm_head": True, "dp_size": 2}, "enable_dp_lm_head"),
]


@pytest.mark.parametrize(("extra", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_combinations_sglang_refuses_at_startup_are_refused(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(UnsupportedRequestError) as caught:
        settings_from_server_args({**BASE, **extra}, MEMORY)
    assert caught.value.field == f"server_args.{field}"
    assert "refuses it at startup" in str(caught.value)


TAKEN: list[dict[str, Any]] = [
    {"dcp_comm_backend": "ag_rs"},
    {"dcp_comm_backend": "a2a", "dcp_size": 2},
    {"dcp_replicate_q_proj": True, "dcp_size": 2, "dcp_comm_backend": "a2a"},
    {"elastic_ep_backend": "mooncake"},
    {"elastic_ep_backend": "mooncake", "max_ep_size": 2},  # not above tp_size: no scale-up
    {"enable_http_worker_reuseport": True, "tokenizer_worker_num": 2},
    {"speculative_use_block_verification": False},
    {"prefill_kv_cache_dequant_dtype": "auto"},
    {"enable_megamoe_for_layernorm_sp": False, "quantize_and_serve": False},
    {"hicache_host_memory_fraction": 1.0},
    {"moe_dp_size": 1, "flashinfer_a2a_dispatch_type": "auto"},
    {"enable_eplb": True, "ep_size": 2},
    {"enable_eplb": True, "moe_a2a_backend": "deepep"},  # ep_size resolved as tp_size, 2
    {"ep_dispatch_algorithm": "dynamic"},
    {"enable_ssl_refresh": True, "ssl_certfile": "c.pem", "ssl_keyfile": "k.pem"},
    {"linear_attn_backend": "flashinfer"},  # on Hopper (no capability given)
    {"enable_tp_lm_head_all_to_all": True, "dp_size": 2, "enable_dp_attention": True},
    {"enable_dp_lm_head": True},  # one DP rank: SGLang turns it off
    {"enable_dp_lm_head": True, "dp_size": 2, "enable_dp_attention": True},
]


@pytest.mark.parametrize("extra", TAKEN)
def test_combinations_sglang_takes_are_planned(extra: dict[str, Any]) -> None:
    settings = settings_from_server_args({**BASE, **extra}, MEMORY)
    assert settings.tp_size == 2


def test_block_verification_with_an_eagle_family_algorithm_passes_the_check() -> None:
    """NEXTN is EAGLE to SGLang; the check lets the speculative settings go on to the
    planner's own draft rules."""
    from hisparse_plan.adapters.sglang.server_args_checks import check_speculative_extras

    for algorithm in ("NEXTN", "EAGLE", "EAGLE3"):
        check_speculative_extras({"speculative_use_block_verification": True,
                                  "speculative_algorithm": algorithm})
    with pytest.raises(UnsupportedRequestError):
        check_speculative_extras({"speculative_use_block_verification": True,
                                  "speculative_algorithm": "NGRAM"})


def test_multi_item_scoring_is_unplanned() -> None:
    """--enable-mis turns the radix cache, chunked prefill and CUDA graphs off and needs
    flashinfer (SGLang refused it on its default backends in the draw): refused unless off."""
    assert "enable_mis" in UNPLANNED
    with pytest.raises(UnsupportedRequestError, match=r"server_args\.enable_mis"):
        settings_from_server_args({**BASE, "enable_mis": True}, MEMORY)
    settings_from_server_args({**BASE, "enable_mis": False}, MEMORY)


CONFIGS = paths.HF_CONFIGS


def _report(config: str, **server_args: Any) -> dict[str, Any]:
    return report_for_case({"config": str(CONFIGS / config / "config.json"),
                            "server_args": {**BASE, **server_args}, "memory": MEMORY})


@pytest.mark.parametrize(("config", "extra", "field"), [
    # "--enable-layernorm-sp is only supported for [...]; got Gemma3ForConditionalGeneration."
    ("gemma-3-27b-it", {"enable_layernorm_sp": True}, "enable_layernorm_sp"),
    ("qwen3-30b-a3b", {"enable_layernorm_sp": True, "tp_size": 1}, "enable_layernorm_sp"),
    ("qwen3-30b-a3b", {"enable_layernorm_sp": True, "pp_size": 2}, "enable_layernorm_sp"),
    # "--shared-experts-tp-size (8) must be a positive divisor of attention TP size (...)"
    ("llama-3.1-8b-instruct", {"shared_experts_tp_size": 8}, "shared_experts_tp_size"),
    ("llama-3.1-8b-instruct", {"shared_experts_tp_size": 2}, "shared_experts_tp_size"),
])
def test_checks_that_read_the_model(config: str, extra: dict[str, Any], field: str) -> None:
    got = _report(config, **extra)
    assert got["error"].startswith(f"UnsupportedRequestError: server_args.{field}: SGLang")


def test_layernorm_sp_on_qwen3_over_ranks_is_planned() -> None:
    """Dense Qwen3 (Qwen3ForCausalLM: Qwen3-30B-A3B's attention, no experts) over 2 ranks."""
    config = json.loads((CONFIGS / "qwen3-30b-a3b" / "config.json").read_text())
    config.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3")
    case = {"config": config, "server_args": {**BASE, "enable_layernorm_sp": True},
            "memory": MEMORY}
    assert "error" not in report_for_case(case)
    case["server_args"]["enable_dp_attention"], case["server_args"]["dp_size"] = True, 2
    assert "attention DP" in report_for_case(case)["error"]


@pytest.mark.parametrize("field", ["enable_cp_decode_attn_tp", "rl_on_policy_target"])
def test_fields_that_move_attention_or_its_sharding_are_unplanned(field: str) -> None:
    """--enable-cp-decode-attn-tp is context parallelism's; --rl-on-policy-target turns
    deterministic inference on (SGLang refused both on the draw's models and backends)."""
    assert field in UNPLANNED


B200 = {"capability": [10, 0]}


@pytest.mark.parametrize(("extra", "field"), [
    # "--linear-attn-decode-backend flashinfer on SM100+ requires --mamba-ssm-dtype bfloat16"
    ({"linear_attn_backend": "flashinfer"}, "linear_attn_decode_backend"),
    ({"linear_attn_decode_backend": "flashinfer"}, "linear_attn_decode_backend"),
    ({"linear_attn_verify_backend": "flashinfer"}, "linear_attn_verify_backend"),
])
def test_flashinfer_linear_attention_on_blackwell_needs_bfloat16_states(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(UnsupportedRequestError) as caught:
        settings_from_server_args({**BASE, **extra}, MEMORY, gpu=B200)
    assert caught.value.field == f"server_args.{field}"
    settings_from_server_args({**BASE, **extra, "mamba_ssm_dtype": "bfloat16"}, MEMORY,
                              gpu=B200)
    settings_from_server_args({**BASE, **extra}, MEMORY, gpu={"capability": [9, 0]})


def test_dwdp_is_unplanned() -> None:
    """DWDP runs attention DP over every rank and turns CUDA graphs off (SGLang refused
    dwdp_size 8 at tp_size 1 in the draw)."""
    assert "dwdp_size" in UNPLANNED
