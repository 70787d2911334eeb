"""`--specs-from-vllm`: a config.json's layers checked against the ones vLLM's own model class
builds on the meta device, before anything is planned from them."""

from __future__ import annotations

import argparse
from dataclasses import replace

from hisparse_plan.adapters.vllm.meta_model import check_layers_agree, kv_cache_specs
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.input_files import config_label
from hisparse_plan.presets import Architecture, Settings, build_request
from hisparse_plan.presets.config_file import read_config_file

META_BUILD_LENGTH = 4096
"""The max_model_len of the meta build, or the model's own when shorter (Whisper's decoder reads
448 tokens, and vLLM refuses a longer one): no layer spec depends on it."""


def refuse_without_config_file(args: argparse.Namespace) -> None:
    """`--specs-from-vllm` needs `--hf-config`: vLLM builds a model from its config.json, which a
    preset or a request file does not carry."""
    if getattr(args, "specs_from_vllm", False) and args.hf_config is None:
        got = "MODEL" if args.model is not None else "--request"
        raise CommandError("--specs-from-vllm: expected --hf-config FILE (vLLM builds the model "
                           f"from a config.json), got {got}")


def checked_by_vllm(
    config_file: str, arch: Architecture, settings: Settings, kv_cache_dtype: str | None,
) -> str:
    """Build the model of `config_file` with vLLM's model class (one rank) and refuse unless the
    config reading gives the same cache layers and model facts at tensor parallel size 1; what
    was checked, in a few words, for the plan's heading."""
    meta = kv_cache_specs(
        read_config_file(config_file, label=config_label(config_file)),
        max_model_len=min(META_BUILD_LENGTH, arch.max_position_embeddings),
        kv_cache_dtype=kv_cache_dtype or "auto",
    )
    one_rank = build_request(arch, replace(settings, tp=1))
    check_layers_agree(one_rank.layers, meta)
    return (f"{len(meta.specs)} layers as vLLM {meta.vllm_version}'s {meta.model_class} "
            "builds them")
