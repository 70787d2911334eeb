"""Differential check: vLLM's own planner (0.34, or 0.33) against hisparse_plan on random
requests, through vLLM's engine flow (global grouping, then `get_kv_cache_configs` per worker)
on a real `VllmConfig` of the installed version (tests/support/vllm_support.py).

Both answers are projected onto the golden fields (tests/support/golden.py `project`) and compared;
a
refusal is compared as a refusal. Needs vLLM (run it in the vLLM venv):

    /work/vllm-venv/bin/python references/vllm_diff.py --count 300 --seed 1 --save-dir /tmp/diff

The requests cover every kind and the modes of vLLM 0.34 (align mode with prefill checkpoints,
the hybrid manager switched off, decode context parallelism with dcp_sharded on and off, Mamba
state_alignment, pipeline stages holding none of a group's layers, HiSparse with auto-fit).
`--target 0.33` (the default when vLLM 0.33 is installed) leaves out what 0.33 cannot state
(state_alignment) and names 0.33's known differences as deliberate.

Outcomes:
- agree_plan / agree_refuse: same projected plan, or both refuse;
- vllm_crash_we_refuse: vLLM fails with an internal error (AssertionError, StopIteration,
  ZeroDivisionError, ...) where we raise PlanError: the SPEC rejects these on purpose (5.13,
  7.3.1 step 8);
- deliberate_*: we refuse where vLLM is unsound: the SPEC says so (7.12), or the planner refuses
  overlaid groups with different block strides (layer-outer layouts); with 0.33, where 0.34
  changed the answer (7.6 step 2: a stage without a group's layers; 7.3.3 with
  sliding_window_mla);
- mismatch_*: anything else, the first few saved as JSON (request, both answers) to look at.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import random
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import hisparse_plan as hp  # noqa: E402
from hisparse_plan.adapters.vllm import (  # noqa: E402
    BUILDER_QUALNAME,
    request_from_vllm,
    to_kv_cache_configs,
)
from support import golden  # noqa: E402
from support import vllm_support as vs  # noqa: E402

GIB = 2**30
T = TypeVar("T")
VLLM_CRASHES = (AssertionError, StopIteration, ZeroDivisionError, TypeError, KeyError, IndexError)


class Generator:
    """Random requests over every kind of SPEC 4 / 4.1 / 7.13: repeated specs, mixed pages,
    padding, alignment, all layouts, pipeline stages, auto-fit, overrides, HiSparse hybrids and
    vLLM 0.34's modes."""

    def __init__(self, seed: int, target: str = "0.34") -> None:
        self.rng = random.Random(seed)
        self.target = target

    def pick(self, *options: T) -> T:
        return self.rng.choice(options)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def kv_layer(self, kind: str, block: int) -> dict[str, Any]:
        heads = self.pick(1, 2, 4, 8, 16)
        head = self.pick(64, 128, 256)
        layer: dict[str, Any] = {
            "kind": kind, "block_size": block, "num_kv_heads": heads, "head_size": head,
            "dtype": self.pick("bfloat16", "bfloat16", "float16", "float8_e4m3fn", "float32"),
        }
        if self.chance(0.15):
            layer["head_size_v"] = self.pick(64, 128, 192)
        if kind == "sliding_window":
            layer["sliding_window"] = self.pick(128, 512, 1024, 4096)
        if kind == "chunked_local_attention":
            layer["attention_chunk_size"] = self.pick(2048, 8192)
        if self.chance(0.1):
            layer["block_stride_alignment"] = self.pick(256, 512, 4096)
        if self.chance(0.15):
            layer["dcp_sharded"] = False
        return layer

    def latent_layer(self, kind: str, block: int) -> dict[str, Any]:
        layer: dict[str, Any] = {"kind": kind, "block_size": block}
        if self.chance(0.5):
            layer.update(head_size=576, dtype="bfloat16")
        else:
            layer.update(head_size=656, dtype="uint8", state_content_bytes=656,
                         cache_dtype="fp8_ds_mla")
        if kind == "sliding_window_mla":
            layer["sliding_window"] = self.pick(128, 512)
            if self.chance(0.4):
                layer["model_version"] = "deepseek_v4"
        if self.chance(0.2):
            layer["compress_ratio"] = self.pick(4, 128)
        if self.chance(0.2):
            layer["alignment"] = self.pick(576, 1024)
        if self.chance(0.1):
            layer["dcp_sharded"] = False
        return layer

    def mamba_layer(self, block: int) -> dict[str, Any]:
        shapes = [[3, self.pick(2048, 4096, 8192)], [self.pick(8, 16, 32), 64, 128]]
        dtypes = [self.pick("bfloat16", "float32") for _ in shapes]
        layer: dict[str, Any] = {
            "kind": "mamba", "block_size": block, "state_shapes": shapes, "state_dtypes": dtypes,
            "num_speculative_blocks": self.pick(0, 0, 1, 2),
        }
        alignment = 1
        if self.target != "0.33" and self.chance(0.3):
            alignment = layer["state_alignment"] = self.pick(16, 256, 1000)
        if self.chance(0.3):
            layer["num_prefill_checkpoint_blocks"] = self.pick(1, 2)
            if self.chance(0.5):
                layer["prefill_checkpoint_alignment"] = self.pick(64, 256)
        if self.chance(0.3):
            natural = sum(
                -(-s[0] * s[1] * (s[2] if len(s) > 2 else 1) * (4 if d == "float32" else 2)
                  // alignment) * alignment
                for s, d in zip(shapes, dtypes, strict=True)
            )
            padded = natural + self.pick(0, 4096, 65536)
            layer["page_size_padded"] = -(-padded // alignment) * alignment
        return layer

    def variants(self, kinds: list[str], block: int) -> list[dict[str, Any]]:
        made = []
        for kind in kinds:
            for _ in range(self.pick(1, 1, 2)):
                layer_block = block if self.chance(0.9) else self.pick(16, 32, 64)
                if kind == "mla":
                    made.append(self.latent_layer("mla", layer_block))
                elif kind == "sliding_window_mla":
                    made.append(self.latent_layer("sliding_window_mla", layer_block))
                elif kind == "mamba":
                    made.append(self.mamba_layer(self.pick(layer_block, 4096)))
                else:
                    made.append(self.kv_layer(kind, layer_block))
        return made

    def other_layers(self, count: int, block: int, allow_mla: bool) -> dict[str, dict[str, Any]]:
        kinds = ["full_attention", "sliding_window", "chunked_local_attention",
                 "sliding_window_mla", "mamba", "cross_attention"] + (
                     ["mla"] if allow_mla else [])
        chosen = self.rng.sample(kinds, self.pick(1, 1, 2, 3))
        variants = self.variants(chosen, block)
        period = [self.rng.choice(variants) for _ in range(self.pick(1, 2, 3, 6))]
        if self.chance(0.25):
            # Each variant in one run of layers: pipeline stages then hold none of some groups.
            return {f"model.layers.{i}.mixer": dict(period[i * len(period) // count])
                    for i in range(count)}
        return {f"model.layers.{i}.mixer": dict(period[i % len(period)]) for i in range(count)}

    def request(self) -> dict[str, Any]:
        layout = self.pick("BLNHC", "BLHNC", "BHLNC", "LBNHC", "LBHNC", "LHBNC")
        block = self.pick(16, 32, 64)
        max_len = self.pick(4096, 32768, 131072)
        request: dict[str, Any] = {
            "model": {"max_model_len": max_len},
            "device": {"available_bytes": self.pick(1, 4, 20, 60) * GIB,
                       "kv_cache_layout": layout},
            "scheduler": {"max_num_batched_tokens": self.pick(2048, 8192),
                          "max_concurrent_batches": self.pick(1, 1, 2),
                          "num_prefill_lookahead_tokens": self.pick(0, 0, 1, 3)},
        }
        if self.chance(0.35):
            self.add_hisparse(request, block)
            if self.chance(0.1):
                request["model"]["auto_fit_max_model_len"] = True
        else:
            request["layers"] = self.other_layers(self.pick(2, 6, 12, 24), block, True)
            if self.chance(0.15):
                request["model"]["auto_fit_max_model_len"] = True
            if self.chance(0.2):
                self.add_stages(request)
        if self.chance(0.1):
            request["device"]["num_blocks_override"] = self.pick(64, 4096, 100000)
        self.add_modes(request, block)
        return request

    def add_modes(self, request: dict[str, Any], block: int) -> None:
        """vLLM 0.34's engine modes: align mode (a Mamba layer's block is the attention
        block), one KV cache manager, decode context parallelism."""
        layers = request["layers"].values()
        if any(layer["kind"] == "mamba" for layer in layers) and self.chance(0.35):
            request["model"]["mamba_cache_mode"] = "align"
            for layer in layers:
                if layer["kind"] == "mamba":
                    layer["block_size"] = block
        if self.chance(0.15):
            request["scheduler"]["disable_hybrid_kv_cache_manager"] = True
        if self.chance(0.2):
            request["scheduler"]["decode_context_parallel_size"] = self.pick(2, 4, 8)

    def add_hisparse(self, request: dict[str, Any], block: int) -> None:
        block = self.pick(block, 64)
        request["device"]["kv_cache_layout"] = self.pick("BLNHC", "BLHNC", "BHLNC", "LBNHC")
        sparse = self.pick(4, 8, 12)
        share = self.pick(1, 1, 2, 4)
        fp8 = self.chance(0.6)
        layers: dict[str, dict[str, Any]] = {}
        for i in range(sparse):
            source: dict[str, Any] = {"kind": "mla", "block_size": block, "cache_role": "sparse",
                                      "is_index_group_leader": i % share == 0}
            source.update({"head_size": 656, "dtype": "uint8", "state_content_bytes": 656}
                          if fp8 else {"head_size": 576, "dtype": "bfloat16"})
            layers[f"model.layers.{i}.attn"] = source
            layers[f"model.layers.{i}.indexer"] = {
                "kind": "mla", "block_size": block, "cache_role": "indexer",
                "head_size": 132, "dtype": "uint8",
            }
        others = self.other_layers(self.pick(0, 2, 6, 12), block, False)
        request["layers"] = layers | {f"other.{name}": spec for name, spec in others.items()}
        request["model"]["index_topk"] = self.pick(512, 2048)
        request["hisparse"] = {
            "host_pool_gib": self.pick(1.0, 4.0, 16.0, 64.0),
            "device_buffer_size": self.pick(None, None, 4096, 5000),
            "max_decode_query_len": self.pick(1, 1, 2, 4),
            "shared_host_pool": self.chance(0.2),
        }

    def add_stages(self, request: dict[str, Any]) -> None:
        names = list(request["layers"])
        count = min(self.pick(2, 3, 4), len(names))
        cuts = sorted(self.rng.sample(range(1, len(names)), count - 1))
        bounds = [0, *cuts, len(names)]
        request["device"]["pipeline_stages"] = [
            {"layers": names[a:b], "available_bytes": self.pick(2, 10, 30) * GIB}
            for a, b in itertools.pairwise(bounds)
        ]


def vllm_answer(request: dict[str, Any]) -> tuple[str, Any]:
    """("plan", projection) or ("refuse"/"crash", "Type: message")."""
    try:
        inputs = vs.vllm_inputs(request)
        return "plan", golden.project(vs.run_view(vs.run_vllm(inputs)))
    except VLLM_CRASHES as error:
        return "crash", f"{type(error).__name__}: {error}"
    except (ValueError, NotImplementedError) as error:
        return "refuse", f"{type(error).__name__}: {error}"


def our_answer(request: dict[str, Any], route: str) -> tuple[str, Any]:
    """Our plan: by `plan()` on the request, by `request_from_vllm` on vLLM's objects (one-stage
    requests; others fall back to `plan()`), or by vLLM's engine flow with our builder."""
    if route != "plan":
        try:
            inputs = vs.vllm_inputs(request)
        except VLLM_CRASHES as error:
            return "unexpressible", f"{type(error).__name__}: {error}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if route == "builder":
                run = vs.run_vllm(inputs, BUILDER_QUALNAME)
                return "plan", golden.project(vs.run_view(run))
            if route == "adapter" and not request["device"].get("pipeline_stages"):
                with vs.vllm_world(vs.DEFAULT_BUILDER, inputs.shared_host_pool):
                    request = request_from_vllm(
                        inputs.specs, inputs.config, inputs.available_bytes
                    ).model_dump(mode="json")
            plan = hp.plan(request)
        return "plan", golden.project(plan.model_dump(mode="json"))
    except hp.PlanError as error:
        return "refuse", f"{type(error).__name__}: {error}"
    except (ValueError, NotImplementedError) as error:
        # Through the builder, vLLM's own admission checks still run first.
        if route == "builder" and "To serve at least one request" in str(error):
            return "refuse", f"{type(error).__name__}: {error}"
        return "crash", f"{type(error).__name__}: {error}"
    except Exception as error:  # an escape is exactly what we look for
        return "crash", f"{type(error).__name__}: {error}"


def stage_misses_a_group(request: dict[str, Any], projected: object) -> bool:
    """A pipeline stage holds none of some group's layers (7.6 step 2)."""
    stages = request["device"].get("pipeline_stages")
    if not stages or not isinstance(projected, dict):
        return False
    return any(
        not set(group["layer_names"]) & set(stage["layers"])
        for stage in stages for group in projected["groups"]
    )


@functools.cache
def vllm_config_refuses_hisparse_without_hybrid_manager() -> bool:
    """Whether the installed vLLM's VllmConfig refuses HiSparse with the hybrid KV cache
    manager disabled (config/vllm.py, `__post_init__`), read from its own source."""
    import inspect

    from vllm.config.vllm import VllmConfig  # type: ignore[import-not-found]

    return "HiSparse requires the hybrid KV cache manager" in inspect.getsource(
        VllmConfig.__post_init__)


def classify(
    request: dict[str, Any], theirs: tuple[str, Any], ours: tuple[str, Any], target: str = "0.34"
) -> str:
    if ours[0] == "unexpressible":
        return "vllm_cannot_build_its_specs"
    if ours[0] == "crash" and theirs[0] != "plan" and ours[1] == theirs[1]:
        # Through the builder, vLLM's own checks around it (its auto-fit, its DCP assertions)
        # stop the engine flow exactly as they stop it stock.
        return "agree_vllm_stops_both_flows"
    if ours[0] == "crash":
        return "mismatch_we_crash"
    if target == "0.33" and theirs != ours:
        if stage_misses_a_group(request, ours[1]):
            # 0.33 places other stages' members of a uniform_type group on such a stage, or
            # fails; the contract follows 0.34.
            return "deliberate_0.33_7.6_stage_without_a_group"
        if ours[0] == "plan" and "NotImplementedError" in str(theirs[1]):
            return "deliberate_0.33_7.3.3_sliding_window_mla"
        if ours[0] == "plan" and "bounded_replay" in str(theirs[1]):
            # 0.33 promotes a sliding_window_mla layer keeping bounded_replay, which
            # MLAAttentionSpec lacks (TypeError); 0.34 drops it.
            return "deliberate_0.33_promotion_keeps_bounded_replay"
    if theirs[0] == "plan" and ours[0] == "plan":
        return "agree_plan" if theirs[1] == ours[1] else "mismatch_plans_differ"
    if theirs[0] == "refuse" and ours[0] == "refuse":
        return "agree_refuse"
    if theirs[0] == "crash" and ours[0] == "refuse":
        return "vllm_crash_we_refuse"
    if theirs[0] == "plan" and ours[0] == "refuse":
        message = ours[1]
        if "pipeline_stages" in message and "uniform_type" in message:
            return "deliberate_7.6_stage_without_uniform_group"
        if "sliding_window_mla" in message and "window" in message and "identical" in message:
            return "deliberate_7.12_mixed_sliding_window_mla"
        if "differ only in alignment" in message:
            return "deliberate_7.12_mixed_alignment"
        if (request.get("hisparse") is not None
                and request.get("scheduler", {}).get("disable_hybrid_kv_cache_manager")
                and vllm_config_refuses_hisparse_without_hybrid_manager()):
            # The harness sets the case's fields on a built VllmConfig, past the check its
            # __post_init__ makes: stock vLLM refuses this request before planning.
            return "agree_vllm_config_refuses"
        if "expected one block stride" in message:
            # Layer-outer layouts whose groups stride blocks differently (7.3.2 scaling): block b
            # of one group overlays other block ids of another; vLLM 0.33 places it anyway.
            return "deliberate_overlaid_block_strides"
        return "mismatch_vllm_plans_we_refuse"
    if theirs[0] == "crash" and ours[0] == "plan":
        return "mismatch_vllm_crash_we_plan"
    return "mismatch_we_plan_vllm_refuses"


def configs_identical(request: dict[str, Any], route: str) -> bool:
    """Every field of every worker's KVCacheConfig (spec objects included) is the same as
    vLLM's: with our builder plugged in, or from `to_kv_cache_configs` of our plan."""
    inputs = vs.vllm_inputs(request)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = vs.run_vllm(inputs).configs
        if route == "builder":
            ours = vs.run_vllm(inputs, BUILDER_QUALNAME).configs
        else:
            ours = to_kv_cache_configs(
                hp.plan(request), inputs.specs,
                prefix_cache_retention_interval=(
                    inputs.config.cache_config.prefix_cache_retention_interval
                ),
            )
    return [vs.canonical(c) for c in ours] == [vs.canonical(c) for c in theirs]


def features(request: dict[str, Any], projected: dict[str, Any]) -> list[str]:
    """What an agreeing plan exercised, to show the generator's reach."""
    device = request["device"]
    kinds = {group["spec"]["kind"] for group in projected["groups"]}
    found = [f"group kind {kind}" for kind in sorted(kinds)]
    found.append("hisparse" if request.get("hisparse") else "regular")
    layer_kinds = {layer["kind"] for layer in request["layers"].values()}
    if request.get("hisparse") and layer_kinds - {"mla"}:
        found.append("hisparse with other layers")
    if device.get("pipeline_stages"):
        found.append("pipeline stages")
    if stage_misses_a_group(request, projected):
        found.append("a stage without a group's layers")
    scheduler = request["scheduler"]
    if request["model"].get("mamba_cache_mode") == "align":
        found.append("mamba align mode")
    if scheduler.get("disable_hybrid_kv_cache_manager"):
        found.append("hybrid manager disabled")
    if scheduler.get("decode_context_parallel_size", 1) > 1:
        sharded = {layer.get("dcp_sharded", True) for layer in request["layers"].values()
                   if layer["kind"] != "mamba"}
        found.extend(f"dcp with dcp_sharded {value}" for value in sorted(sharded))
    if any(layer.get("state_alignment", 1) > 1 for layer in request["layers"].values()):
        found.append("mamba state_alignment")
    if any(layer.get("num_prefill_checkpoint_blocks") for layer in request["layers"].values()):
        found.append("mamba prefill checkpoints")
    if request["model"].get("auto_fit_max_model_len"):
        found.append("auto-fit")
    if device.get("num_blocks_override"):
        found.append("num_blocks_override")
    if device["kv_cache_layout"][0] != "B":
        found.append("layer-outer layout")
    pages = {(g["spec"]["block_size"], g["spec"]["page_size_bytes"]) for g in projected["groups"]}
    if len(pages) > 1:
        found.append("groups of different block bytes")
    if any(g["spec"]["block_size"] != layer["block_size"]
           for g in projected["groups"] for name in g["layer_names"]
           if (layer := request["layers"].get(name)) is not None):
        found.append("scaled block size (7.3.2)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save-dir", type=Path, default=None,
                        help="write the first mismatches of each kind here as JSON")
    parser.add_argument("--keep", type=int, default=3, help="examples saved per outcome")
    parser.add_argument("--ours", choices=("plan", "adapter", "builder"), default="plan",
                        help="plan(request), plan(request_from_vllm(...)), or vLLM with our "
                        "builder plugged in; the last two also compare whole KVCacheConfigs")
    parser.add_argument("--target", choices=("0.33", "0.34"),
                        default="0.34" if vs.IS_034 else "0.33",
                        help="the vLLM whose flow is compared (default: the installed one)")
    args = parser.parse_args()
    generator = Generator(args.seed, args.target)
    outcomes: Counter[str] = Counter()
    reach: Counter[str] = Counter()
    for index in range(args.count):
        request = generator.request()
        theirs, ours = vllm_answer(request), our_answer(request, args.ours)
        outcome = classify(request, theirs, ours, args.target)
        if (outcome == "agree_plan" and args.ours != "plan"
                and not configs_identical(request, args.ours)):
            outcome = "mismatch_config_fields"
        outcomes[outcome] += 1
        if outcome == "agree_plan":
            reach.update(features(request, theirs[1]))
        noted = outcome.startswith(("mismatch", "deliberate", "vllm_c"))
        if noted and args.save_dir and outcomes[outcome] <= args.keep:
            args.save_dir.mkdir(parents=True, exist_ok=True)
            path = args.save_dir / f"mismatch_{outcome}_{index}.json"
            path.write_text(json.dumps(
                {"outcome": outcome, "request": request, "vllm": theirs, "ours": ours},
                indent=1,
            ))
        if outcome.startswith("mismatch") and outcomes[outcome] <= args.keep:
            print(f"#{index} {outcome}: vllm {theirs[0]} / ours {ours[0]}: "
                  f"{str(ours[1] if ours[0] != 'plan' else theirs[1])[:200]}")
    print(f"{args.count} requests (seed {args.seed}, ours by {args.ours}, vLLM "
          f"{vs.VLLM_VERSION}, target {args.target}):")
    for outcome, count in sorted(outcomes.items()):
        print(f"  {outcome:48s} {count}")
    print("agreeing plans exercised:")
    for feature, count in sorted(reach.items()):
        print(f"  {feature:48s} {count}")


if __name__ == "__main__":
    main()
