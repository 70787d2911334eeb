"""The layers vLLM 0.34's Transformers modeling backend builds (`models/transformers/base.py`,
`Base._create_attention_instances`), for a config vLLM serves through it.

The backend builds transformers' own model (`AutoModel.from_config`) and gives each decoder
layer one vLLM attention layer, attached to the transformers module that calls the attention
interface for that layer (`fusers/attention.py`) and named by that module's path:
`model.<path>.attn`, where the path is transformers' (`layers.{i}.self_attn` for most, GPT-2's
`h.{i}.attn`, GPT-NeoX's `layers.{i}.attention`, a wrapper's `language_model.layers.{i}...`;
read from data/vllm_resolution.json, which references/vllm_resolution_data.py writes from
transformers). Each layer is:

- MLA (`MLAAttention`, one latent row of `kv_lora_rank + qk_rope_head_dim`) when the config
  has `kv_lora_rank` (`ModelConfig.use_mla` for the backend) and the module has the latent
  projection `kv_b_proj` the MLA fuser needs; with `kv_lora_rank` but no such module, full
  attention whose head size is `qk_nope_head_dim + qk_rope_head_dim`;
- else `Attention`, sliding by `sliding_window` exactly where `layer_types` says
  `sliding_attention`, full otherwise; without `layer_types`, every layer slides by
  `sliding_window` when it is set (`CacheConfig.sliding_window`, engine/arg_utils.py). No
  other window field is read, and no cache beyond attention is built (an indexer's fields
  are ignored);
- KV heads: the first of `n_head_kv`, `num_kv_heads`, `num_key_value_heads`,
  `multi_query_group_num`, `num_attention_groups` that is set, else `num_attention_heads`
  (`get_total_num_kv_heads`); head size: `head_dim` when positive, else
  `hidden_size_per_head`, else `hidden_size // num_attention_heads` (`get_head_size`,
  transformers_utils/model_arch_config_convertor.py).

A heterogeneous model's layers take their own KV heads and head size
(`model_arch_config[i]`: Gemma-4's full layers, `families.gemma4`).

A layer whose `layer_types` entry is neither (linear attention, Mamba) dispatches through no
attention interface, and vLLM refuses the model; so does the reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from hisparse_plan.presets.attribute_maps import attribute_map
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.families.gemma4 import GEMMA4, gemma4_heads
from hisparse_plan.presets.regular import LayerKind

KV_HEAD_FIELDS: Final = (
    "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num",
    "num_attention_groups",
)
"""vLLM's `CONFIG_FIELD_ALIASES["total_num_kv_heads"]`, in its order."""
BACKEND_KINDS: Final[dict[str, LayerKind]] = {
    "full_attention": "full", "sliding_attention": "sliding",
}
DERIVED_BY_TRANSFORMERS: Final = (
    "use_sliding_window", "max_window_layers", "sliding_window_pattern", "layers_block_type",
    "no_rope_layers", "attention_chunk_size", "hybrid_override_pattern", "attn_type_list",
    "linear_attn_config", "full_attention_interval", "interleaved_sliding_window",
)
"""Fields from which transformers' config class derives `layer_types`, which the backend reads:
without `layer_types` they cannot be read here."""


def _kv_heads(fields: base.Fields) -> Any:  # noqa: ANN401 - a config value
    for name in KV_HEAD_FIELDS:
        if fields.get(name) is not None:
            return fields[name]
    return fields.get("num_attention_heads")


def _head_size(fields: base.Fields) -> Any:  # noqa: ANN401 - a config value
    head_dim = fields.get("head_dim")
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    if fields.get("hidden_size_per_head") is not None:
        return fields["hidden_size_per_head"]
    return None  # RegularArchitecture: hidden_size // num_attention_heads


def _through_class(fields: base.Fields) -> dict[str, Any]:
    """`layer_types` and `sliding_window` as the backend reads them, through transformers'
    class (`attribute_map`: Bamba's and Nemotron-H's `layer_types` is `layers_block_type`,
    RecurrentGemma's `sliding_window` its `attention_window_size`)."""
    named = dict(fields)
    model_type = fields.get("model_type")
    if isinstance(model_type, str):
        mapped = attribute_map(model_type)
        for name in ("layer_types", "sliding_window"):
            own = mapped.get(name)
            if own is not None and named.get(name) is None and named.get(own) is not None:
                named[name] = named[own]
    return named


def backend_layout(fields: base.Fields, layers: int, found: Mapping[str, Any], arch: str,
                   *, multimodal: bool = False) -> base.Layout:
    """The layers the Transformers backend builds for transformers' class `arch` (`found`:
    what the backend finds in it; `multimodal`: the backend's multimodal class, whose vision
    tower's bidirectional attention does not make the model an encoder)."""
    template = found.get("attention")
    if not isinstance(template, str) or not found.get("layers"):
        what = ("no module that calls the attention interface" if not template else
                f"attention modules at several paths ({', '.join(map(str, template))})"
                if isinstance(template, list) else "nothing (the class failed to build)")
        raise ConfigError(
            f"architectures: vLLM 0.34 serves {arch} through its Transformers backend, which "
            f"finds {what} in transformers' model; vLLM refuses to build a model whose layers "
            "do not each dispatch through the attention interface",
            field="architectures")
    if found.get("encoder") and not multimodal:
        raise ConfigError(
            f"architectures: vLLM 0.34 serves {arch} through its Transformers backend as an "
            "encoder (a module of transformers' model is not causal: EncoderOnlyAttention), "
            "which keeps no KV cache; expected a decoder, whose cache a plan lays out",
            field="architectures")
    fields = _through_class(fields)
    if not base.given(fields, "layer_types"):
        unread = [name for name in DERIVED_BY_TRANSFORMERS if base.given(fields, name)]
        if unread:
            raise ConfigError(
                f"{unread[0]}: vLLM's Transformers backend lays layers out by the layer_types "
                "transformers' config class derives from this field; expected layer_types "
                "(install hisparse-plan[hf] to have transformers derive it)", field=unread[0])
    reads = ("layer_types", "sliding_window", "kv_lora_rank", *DERIVED_BY_TRANSFORMERS)
    names = {"attention": f"model.{template}.attn"}
    heads = {"num_key_value_heads": _kv_heads(fields), "head_dim": _head_size(fields)}
    if fields.get("kv_lora_rank") is not None:
        if found.get("mla"):
            return base.Layout(["mla"] * layers, reads, names=names)
        nope, rope = fields.get("qk_nope_head_dim") or 0, fields.get("qk_rope_head_dim") or 0
        heads["head_dim"] = (nope + rope) or heads["head_dim"]
    if base.given(fields, "layer_types"):
        kinds = base.from_layer_types(fields, layers, BACKEND_KINDS,
                                      "vLLM's Transformers backend (attention only)")
    else:
        # No layer_types: every layer slides by the model's window, if it has one
        # (EngineArgs.create_engine_config sets CacheConfig.sliding_window, which `Attention`
        # takes where no per-layer window is given; 0 is none: ModelConfig).
        kinds = ["sliding" if fields.get("sliding_window") else "full"] * layers
    per_layer: dict[int, tuple[int, int]] = {}
    if fields.get("model_type") in GEMMA4.model_types:
        # Each layer's geometry is `model_arch_config[i]`, transformers' per_layer_config.
        per_layer = gemma4_heads({**fields, **heads}, [
            "full_attention" if kind == "full" else "sliding_attention" for kind in kinds])
    return base.Layout(kinds, reads, names=names, heads=per_layer,
                       fields={**heads, **({} if "sliding" in kinds else {"sliding_window": None})})
