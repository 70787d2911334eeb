"""Speculative decoding's draft model as SGLang reads it, into the request's settings: the
draft's KV layers (`eagle_draft_num_layers`: the draft config's num_nextn_predict_layers, else
its layer count) and, for an MHA draft, its heads on one attention rank and head_dim.

Where the draft comes from, as SGLang resolves `--speculative-draft-model-path`: a draft
config given beside the case (`draft_config`, an EAGLE/EAGLE3 checkpoint's config.json),
`"@model"` (the target's own checkpoint, read in draft mode), or none (NEXTN on a model whose
config names num_nextn_predict_layers: SGLang points the draft at the target itself)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from hisparse_plan.errors import PlanError
from hisparse_plan.models.json_input import excerpt
from hisparse_plan.presets.config_file import model_from_config, read_config_file
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.targets.sglang.served.architectures import HYBRID_SWA_ARCHITECTURES
from hisparse_plan.targets.sglang.served.hf_config import derived_context_length

TARGET_CHECKPOINT: Final = "@model"
"""`speculative_draft_model_path` naming the target's own checkpoint."""


def _count(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PlanError(f"draft_config.{key}: expected a count, got {excerpt(value, 40)}",
                        field=f"draft_config.{key}")
    return value


ONE_LAYER_DRAFT_MODE: Final = frozenset({
    "DeepseekV4ForCausalLM", "Glm5NextForConditionalGeneration", "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM", "Step3p5ForCausalLM", "InklingForConditionalGeneration",
    "Qwen3NextForCausalLM", "Qwen4ExpForConditionalGeneration", "Qwen3MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM",
    "NemotronH_Omni_Reasoning_V3", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "HYV3ForCausalLM", "HYV4ForCausalLM",
})
"""Architectures whose checkpoint SGLang reads in draft mode (`ModelConfig._config_draft_model`)
as a one-layer MTP head (num_nextn_predict_layers = 1, or one layer by its MTP class)."""


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config SGLang reads the layers from (its hf_text_config): a multimodal config's
    text_config, else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def draft_layer_count(config: Mapping[str, Any]) -> int | None:
    """SGLang's draft layers for a config read in draft mode: one for an architecture whose
    draft mode is a one-layer MTP head, else its num_nextn_predict_layers when above 0 (an MTP
    head), else its num_hidden_layers (an EAGLE model; a multimodal config's text_config's);
    None if it names neither."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and archs[0] in ONE_LAYER_DRAFT_MODE:
        return 1
    nextn = _count(config, "num_nextn_predict_layers")
    if nextn:
        return nextn
    hidden = _count(config, "num_hidden_layers")
    return hidden if hidden is not None else _count(_text(config), "num_hidden_layers")


CHUNKED_EVERY_FOURTH: Final = "Llama4ForConditionalGeneration"
"""SGLang's one hybrid-window architecture whose window layers are not read from layer_types:
every layer but each fourth (`get_hybrid_layer_ids`)."""


def draft_window_layers(config: Mapping[str, Any]) -> list[int]:
    """A hybrid-window draft's window layers by its own ids (SGLang's swa_attention_layer_ids
    of the draft config, `get_hybrid_layer_ids`, whose count is eagle_draft_swa_num_layers):
    Llama-4's every layer but each fourth, else the sliding_attention entries of layer_types,
    for SGLang's hybrid-window architectures; none otherwise."""
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    text = _text(config)
    if arch == CHUNKED_EVERY_FOURTH:
        layers = _count(text, "num_hidden_layers") or 0
        return [i for i in range(layers) if (i + 1) % 4]
    types = text.get("layer_types")
    if arch not in HYBRID_SWA_ARCHITECTURES or not isinstance(types, list):
        return []
    return [i for i, kind in enumerate(types) if kind == "sliding_attention"]


def _draft_config(
    server_args: Mapping[str, Any], draft_config: Mapping[str, Any] | str | Path | None,
    target: Mapping[str, Any],
) -> Mapping[str, Any] | None:
    """The draft's config: given, the target's ("@model"), a checkpoint folder's, or None."""
    if isinstance(draft_config, Mapping):
        return draft_config
    if isinstance(draft_config, str | Path):
        return read_config_file(draft_config)
    path = server_args.get("speculative_draft_model_path")
    if path is None:
        return None
    if path == TARGET_CHECKPOINT:
        return target
    if not isinstance(path, str):
        raise PlanError(f"server_args.speculative_draft_model_path: expected a folder holding "
                        f"config.json, got {excerpt(path, 40)}",
                        field="server_args.speculative_draft_model_path")
    return read_config_file(Path(path) / "config.json")


def _read_as_a_model(config: Mapping[str, Any]) -> None:
    """A separate draft's config.json passes the bounds a target's does (`model_from_config`:
    its layer counts, heads, hidden size, head_dim, vocabulary, window, text_config and
    model_type), before any figure is taken from it: SGLang's draft worker builds its pools
    from this config, so an absurd head count would size absurd pools."""
    try:
        model_from_config(config, origin="draft_config")
    except ConfigError as error:
        field = f"draft_config.{error.field}" if error.field else "draft_config"
        raise PlanError(str(error), field=field) from None


def draft_settings(
    target: Mapping[str, Any], server_args: Mapping[str, Any],
    draft_config: Mapping[str, Any] | str | Path | None, attn_tp: int,
) -> dict[str, Any]:
    """The draft's SGLangSettings fields (none without a speculative_algorithm). A separate
    draft config's dtype must be the target's: SGLang's `auto` kv dtype follows each model's
    own, which the plan does not split."""
    if server_args.get("speculative_algorithm") is None:
        return {}
    config = _draft_config(server_args, draft_config, target)
    if config is None:
        layers = _count(target, "num_nextn_predict_layers") or None
        return {} if layers is None else {"speculative_draft_num_layers": layers}
    if config is not target:
        _read_as_a_model(config)
    fields: dict[str, Any] = {}
    layers = draft_layer_count(config)
    if layers is not None:
        fields["speculative_draft_num_layers"] = layers
    windows = draft_window_layers(config)
    if windows:
        fields["speculative_draft_window_layers"] = len(windows)
        fields["speculative_draft_window_layer_ids"] = windows
    if config is target:
        return fields
    # SGLang hands the draft's ModelConfig the server's context_length when one is given
    # (else the draft derives its own, and nothing is refused): draft_context.py's rule.
    context = derived_context_length(config)
    if context is not None and server_args.get("context_length") is not None:
        fields["speculative_draft_context_length"] = context
    if config.get("torch_dtype", target.get("torch_dtype")) != target.get("torch_dtype"):
        raise PlanError(
            f"draft_config.torch_dtype: the draft's KV pool follows its own dtype; expected the "
            f"target's {target.get('torch_dtype')!r}, got {config.get('torch_dtype')!r}",
            field="draft_config.torch_dtype")
    heads = _count(config, "num_key_value_heads") or _count(config, "num_attention_heads")
    if heads:
        fields["speculative_draft_kv_heads"] = max(1, heads // attn_tp)
    head_dim = _count(config, "head_dim")
    hidden, attention = _count(config, "hidden_size"), _count(config, "num_attention_heads")
    if not head_dim and hidden and attention:
        head_dim = hidden // attention
    if head_dim:
        fields["speculative_draft_head_dim"] = head_dim
    return fields
