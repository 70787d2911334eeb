"""`--speculative-draft-model-path` for `--engine sglang`: the draft model as SGLang finds it,
into the draft's settings (its layers, a hybrid-window draft's window layers, an MHA draft's
heads), read by the adapter's own rules (adapters/sglang/draft.py). `@model` is the target's
own checkpoint (gpt-oss drafting with itself: a draft with window layers); any other value is
a folder holding the draft's config.json."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any, Final

from hisparse_plan.adapters.sglang.draft import TARGET_CHECKPOINT, draft_settings
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.errors import PlanError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import Architecture
from hisparse_plan.targets.sglang.model import read_model
from hisparse_plan.targets.sglang.served.llama4 import is_llama4_hybrid, read_llama4_model

TARGET_CONFIG: Final = "_target_config"
"""The facts' key of the target's config (popped before the settings are built)."""


def add_draft_path_argument(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--speculative-draft-model-path", metavar="PATH",
                       help=f"the EAGLE/EAGLE3 draft: {TARGET_CHECKPOINT} for the model's own "
                            "checkpoint (a window model's draft keeps window layers), or a "
                            "folder holding the draft's config.json; its layers (and window "
                            "layers) replace --speculative-draft-num-layers")


def preset_config(arch: Architecture, architecture: str | None) -> dict[str, Any]:
    """A preset's layers as the config.json fields the draft rules read (its architecture
    as SGLang names it, and the dtype its caches take: a draft's must be the same)."""
    config = arch.model_dump(mode="json", exclude_none=True)
    if architecture is not None:
        config["architectures"] = [architecture]
    dtype = getattr(arch, "auto_cache_dtype", None)
    if "torch_dtype" not in config and isinstance(dtype, str):
        config["torch_dtype"] = dtype
    return config


def draft_path_settings(
    args: argparse.Namespace, target: Mapping[str, Any] | None, fields: Mapping[str, Any]
) -> dict[str, Any]:
    """The draft's settings for the flag (none without it); it needs an algorithm, and with it
    the draft's layers come from the draft, not --speculative-draft-num-layers."""
    path = getattr(args, "speculative_draft_model_path", None)
    if path is None:
        return {}
    if args.speculative_algorithm is None:
        raise CommandError("--speculative-draft-model-path needs --speculative-algorithm")
    if args.speculative_draft_num_layers is not None:
        raise CommandError("--speculative-draft-num-layers and --speculative-draft-model-path "
                           "both give the draft's layers; expected one of them")
    tp = int(fields.get("tp_size", 1))
    attn_tp = tp // int(fields.get("dp_size", 1)) if fields.get("enable_dp_attention") else tp
    server_args = {"speculative_algorithm": args.speculative_algorithm,
                   "speculative_draft_model_path": path}
    try:
        drafted = draft_settings(target or {}, server_args, None, attn_tp)
    except (PlanError, OSError) as exc:
        raise CommandError(f"--speculative-draft-model-path {path}: {exc}") from exc
    if "speculative_draft_num_layers" not in drafted:
        raise CommandError(f"--speculative-draft-model-path {path}: the draft's config names "
                           "no layers (num_hidden_layers or num_nextn_predict_layers)")
    return drafted


DECODER_LAYER: Final = re.compile(r"layers\.(\d+)\.")


def with_target_windows(args: argparse.Namespace, request: PlanRequest) -> PlanRequest:
    """`@model` on a preset whose architecture SGLang's table here does not name (Llama-4's
    llama4_text): the draft is the target's own checkpoint, so its window layers are the
    target's, by decoder index, as the planner reads them (an unknown architecture keeps the
    window pool its layers ask for)."""
    engine = request.engine
    if (getattr(args, "speculative_draft_model_path", None) != TARGET_CHECKPOINT
            or not isinstance(engine, SGLangSettings) or engine.architecture is not None
            or engine.speculative_draft_window_layers):
        return request
    try:
        swa = (read_llama4_model(request, engine) if is_llama4_hybrid(request, engine)
               else read_model(request)).swa
    except PlanError:
        return request  # the planner refuses it, naming why
    found = [DECODER_LAYER.search(name) for name in swa.names] if swa is not None else []
    ids = sorted({int(match.group(1)) for match in found if match is not None})
    if not ids or len(ids) != len(found):
        return request
    drafted = SGLangSettings.model_validate({
        **engine.model_dump(), "speculative_draft_window_layers": len(ids),
        "speculative_draft_window_layer_ids": ids})
    return request.model_copy(update={"engine": drafted})
