"""Every preset as `hisparse-plan plan PRESET --engine sglang ...` plans it, beside the case SGLang
0.5.23's own code sizes for the model's published config.json with the same server arguments.

Our side is the CLI's preset path (`resolve_sglang_source`: the preset's cache-shaping fields,
the architecture its model_type names, the GPU's memory and weights), not the config reader,
so a preset whose fields drifted from its published config shows up as a mismatch. The
reference's config is the published one kept in tests/hf_configs (references/sglang_cases for
DeepSeek-V4-Flash), with the preset's own config fields laid over it where the preset is a
what-if of a published model (GLM-5 with a shared index); every overlay must either equal the
published value, fill a field the published config leaves to its default, or be one of the
preset's stated what-if fields.

    python references/sglang_diff.py --presets
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hisparse_plan.models.request import PlanRequest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURES = REPO / "tests" / "hf_configs"

PUBLISHED_CONFIG: dict[str, Path] = {
    "deepseek-v3.2": FIXTURES / "deepseek-v3.2-exp" / "config.json",
    "glm-5": FIXTURES / "glm-5" / "config.json",
    "glm-5.1": FIXTURES / "glm-5" / "config.json",
    "glm-5-index-share-4": FIXTURES / "glm-5" / "config.json",
    "llama-3-8b": FIXTURES / "llama-3.1-8b-instruct" / "config.json",
    "llama-3-70b": FIXTURES / "llama-3.1-70b-instruct" / "config.json",
    "gemma-3-27b": FIXTURES / "gemma-3-27b-it" / "config.json",
    "gpt-oss-120b": FIXTURES / "gpt-oss-120b" / "config.json",
    "llama-4-scout": FIXTURES / "llama-4-scout-17b-16e-instruct" / "config.json",
    "qwen3-next-80b": FIXTURES / "qwen3-next-80b-a3b-instruct" / "config.json",
    "deepseek-v4-flash": HERE / "sglang_cases" / "deepseek_v4_flash_config.json",
}
"""The published config.json each preset was written from (a Llama-3.1 config stands in for
Llama-3's: the same cache-shaping fields but the context length, which the preset sets)."""

WHAT_IF_FIELDS: dict[str, frozenset[str]] = {
    "glm-5-index-share-4": frozenset({"index_topk_freq", "index_skip_topk_offset"}),
    "llama-3-8b": frozenset({"max_position_embeddings"}),
}
"""Preset fields that are not in the published config on purpose."""

FLAG_SETS: dict[str, list[str]] = {
    "h200-tp8": ["--gpu", "h200", "--tp", "8"],
    "b200-tp8": ["--gpu", "b200", "--tp", "8"],
    "h200-tp8-dp8": ["--gpu", "h200", "--tp", "8", "--enable-dp-attention", "--dp-size", "8"],
    "h200-tp8-hisparse": ["--gpu", "h200", "--tp", "8", "--enable-hisparse"],
}
"""How each preset is served; HiSparse only where the preset is a sparse-MLA model."""

SERVER_ARG_FIELDS = (
    "tp_size", "context_length", "kv_cache_dtype", "page_size", "mem_fraction_static",
    "max_running_requests", "max_total_tokens", "dsa_backend", "dp_size", "moe_a2a_backend",
    "dcp_size",
)
"""SGLangSettings fields that are ServerArgs of the same name."""


def _preset_fields(name: str) -> dict[str, Any]:
    """The config.json fields a preset keeps (its entry in the package's models.json)."""
    from importlib.resources import files

    catalog = json.loads(files("hisparse_plan.presets").joinpath("data", "models.json")
                         .read_text(encoding="utf-8"))
    fields: dict[str, Any] = catalog[name]["config"]
    return fields


def _published(name: str) -> dict[str, Any]:
    """The published config with the preset's fields laid over it; a preset field that differs
    from the published one, and is not a stated what-if, is an error: the preset drifted."""
    top: dict[str, Any] = json.loads(PUBLISHED_CONFIG[name].read_text(encoding="utf-8"))
    # Multimodal checkpoints keep the language model's fields in text_config.
    target = top.get("text_config", top)
    for key, value in _preset_fields(name).items():
        if key == "model_type" or target.get(key) == value:
            continue
        # A field the published config leaves to transformers' default is filled in.
        if key in target and key not in WHAT_IF_FIELDS.get(name, frozenset()):
            raise ValueError(f"preset {name}: {key} = {value!r}, the published config has "
                             f"{target.get(key)!r}")
        target[key] = value
    return top


def _case(name: str, label: str, flags: list[str]) -> tuple[dict[str, Any], PlanRequest] | None:
    """(the reference case, our request) for one preset served with `flags`; None where the
    flags do not apply to the preset (HiSparse on a dense model)."""
    from hisparse_plan.cli.main import build_parser
    from hisparse_plan.cli.sglang.source import resolve_sglang_source
    from hisparse_plan.presets import ModelArchitecture, load_preset

    if "--enable-hisparse" in flags and not isinstance(load_preset(name).architecture,
                                                       ModelArchitecture):
        return None
    args = build_parser().parse_args(["plan", name, "--engine", "sglang", *flags])
    request = resolve_sglang_source(args).request
    settings = request.engine
    if settings is None:
        raise ValueError(f"preset {name}: the CLI's SGLang request carries no SGLang settings")
    server_args = {key: getattr(settings, key) for key in SERVER_ARG_FIELDS
                   if getattr(settings, key, None) is not None}
    if settings.enable_dp_attention:
        server_args["enable_dp_attention"] = True
    if settings.enable_hisparse:
        server_args["enable_hisparse"] = True
        server_args["hisparse_config"] = {}
    memory = {"pre_model_load_free_bytes": settings.pre_model_load_free_bytes,
              "post_weights_free_bytes": settings.post_weights_free_bytes}
    gpu = {"total_memory_bytes": settings.gpu_memory_bytes,
           "name": "NVIDIA B200" if label.startswith("b200") else "NVIDIA H200",
           "capability": list(settings.compute_capability or (9, 0))}
    case = {"name": f"preset:{name}:{label}", "config": _published(name),
            "server_args": server_args, "memory": memory, "gpu": gpu}
    return case, request


def preset_cases() -> Iterator[tuple[dict[str, Any], PlanRequest]]:
    """(case, our request) for every preset and flag set. A preset that drifted from its
    published config, or flags the CLI refuses, stop the run: neither is a comparison."""
    from hisparse_plan.presets import preset_names

    for name in preset_names():
        for label, flags in FLAG_SETS.items():
            pair = _case(name, label, flags)
            if pair is not None:
                yield pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    for case, _ in preset_cases():
        print(json.dumps(case)[:200])


if __name__ == "__main__":
    main()
