"""Inkling (`inkling_text`, `inkling_mm_model`): every decoder layer keeps a short-convolution
state, as a sliding-window cache, beside its attention cache.

vLLM 0.34's `models/inkling/nvidia/model.py`: `InklingDecoderLayer` builds first an
`InklingConvState` (`model.layers.{i}.conv_state`, `sconv_swa_attn.py`), then its attention
(`model.layers.{i}.attn`, `attention.py`). Layer i is local when it is in `local_layer_ids`
(vLLM's `InklingModelConfig`, default none): its attention keeps `swa_num_key_value_heads` KV
heads of `swa_head_dim` sliding by `sliding_window_size` (default 512); any other layer keeps a
full-attention cache of `num_key_value_heads` heads of `head_dim`. vLLM reads no `layer_types`
(transformers' Inkling config writes one; vLLM's config class drops it). The conv state's
geometry (`regular_request._sconv_window`) comes from the layer's KV heads and head size,
`hidden_size` and `sconv_kernel_size` (else `conv_kernel_size`, else 4). vLLM's own defaults
for the fields a file leaves out are set here (`InklingModelConfig.__init__`).
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.regular import LayerKind

WINDOW: Final = 512
"""InklingModelConfig's default `sliding_window_size`."""
KERNEL: Final = 4
"""InklingModelConfig's default `sconv_kernel_size`."""


def _local_layers(fields: base.Fields) -> set[int]:
    ids = fields.get("local_layer_ids")
    if ids is None:
        return set()
    if not isinstance(ids, list) or any(
            not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids):
        raise ConfigError(f"local_layer_ids: Inkling's local layers; expected a list of layer "
                          f"indices, got {ids!r}", field="local_layer_ids")
    return set(ids)


def read_inkling(fields: base.Fields, layers: int) -> base.Layout:
    local = _local_layers(fields)
    kinds: list[LayerKind] = ["sliding_and_sconv" if i in local else "full_and_sconv"
                              for i in range(layers)]
    kernel_field = next((name for name in ("sconv_kernel_size", "conv_kernel_size")
                         if fields.get(name) is not None), None)
    kernel = KERNEL if kernel_field is None else base.positive(
        fields, kernel_field, "Inkling's short-convolution kernel (its conv state's window)")
    overrides: dict[str, object] = {"sconv_kernel_size": kernel, "sliding_window": None}
    heads: dict[int, tuple[int, int]] = {}
    if local & set(range(layers)):
        overrides["sliding_window"] = base.positive(
            fields, "sliding_window_size", "Inkling's local layers' window") if fields.get(
                "sliding_window_size") is not None else WINDOW
        why = "Inkling's local layers' KV heads and head size"
        kv = base.positive(fields, "num_key_value_heads", why)
        size = (base.positive(fields, "head_dim", why) if fields.get("head_dim") is not None
                else base.positive(fields, "hidden_size", why)
                // base.positive(fields, "num_attention_heads", why))
        swa_kv = (base.positive(fields, "swa_num_key_value_heads", why)
                  if fields.get("swa_num_key_value_heads") is not None else kv)
        swa_size = (base.positive(fields, "swa_head_dim", why)
                    if fields.get("swa_head_dim") is not None else size)
        if (swa_kv, swa_size) != (kv, size):
            heads = {i: (swa_kv, swa_size) for i in sorted(local) if i < layers}
    return base.Layout(kinds, ("layer_types", "sliding_window"), fields=overrides, heads=heads,
                       names={"attention": "model.layers.{i}.attn",
                              "sconv": "model.layers.{i}.conv_state"})


INKLING = base.Family(
    name="inkling",
    model_types=("inkling_text", "inkling_mm_model", "inkling_model"),
    architectures=("InklingForCausalLM", "InklingForConditionalGeneration"),
    read=read_inkling,
    vllm="models/inkling/nvidia/model.py, sconv_swa_attn.py, configs.py",
    sglang=base.SGLangRule(refusal=(
        "SGLang 0.5.23 serves Inkling (srt/models/inkling.py) with short-convolution state "
        "pools of its own, which the SGLang target does not lay out yet")),
)
