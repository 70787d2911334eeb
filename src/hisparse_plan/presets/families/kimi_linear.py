"""Kimi-Linear: Kimi Delta Attention (KDA) layers with an MLA layer every few.

vLLM 0.34 reads the config with its own `KimiLinearConfig` (`transformers_utils/configs/
kimi_linear.py`; not transformers'), and `models/kimi_k3/nvidia/model.py`
(`KimiLinearForCausalLM`) builds layer i as KDA when `i + 1` is in
`linear_attn_config.kda_layers` (the lists count from 1), else as MLA; both register as
`model.layers.{i}.self_attn`:
- MLA: one latent row of `kv_lora_rank + qk_rope_head_dim` elements a token (576), replicated
  over the tensor-parallel ranks, in the model dtype;
- KDA (`model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py`): with `h` =
  `linear_attn_config.num_heads` and `d` its `head_dim`, a conv state `[short_conv_kernel_size -
  1, 3 x h x d / tp]` (q, k and v side by side) in the model dtype and a recurrent state
  `[h / tp, d, d]` in float32; no prefill checkpoints (the KDA layer declares none).
`max_position_embeddings` defaults to 4096 in vLLM's config class (Kimi-Linear's file has only a
`model_max_length`, which caps a longer `--max-model-len` in vLLM). The Kimi-K3 variants (a DSA
`dsa_config`, or `use_full_rank_gate`) build other layers and are refused.

SGLang 0.5.23 serves Kimi-Linear (`srt/models/kimi_linear.py`, `configs/mamba_utils.py`'s
`KimiLinearCacheParams`): three conv states (q, k, v) and a recurrent state per KDA layer beside
an MLA pool, which the SGLang target does not plan (it keeps MLA and Mamba-style states apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.mamba_states import KdaGeometry
from hisparse_plan.presets.regular import LayerKind

CONFIG: Final = "linear_attn_config"
VLLM_MAX_POSITIONS: Final = 4096
"""vLLM's KimiLinearConfig's default `max_position_embeddings`."""
NAMES: Final = {"attention": "model.layers.{i}.self_attn", "linear": "model.layers.{i}.self_attn"}


def _config(fields: base.Fields) -> Mapping[str, Any]:
    value = fields.get(CONFIG)
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{CONFIG}: Kimi-Linear's KDA layers are listed in it; expected an object, got "
            f"{type(value).__name__}",
            field=CONFIG,
        )
    return value


def _kda_layers(config: Mapping[str, Any], layers: int) -> set[int]:
    """The 0-based KDA layers: vLLM reads `kda_layers` counting from 1."""
    listed = config.get("kda_layers")
    if not isinstance(listed, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= layers for n in listed):
        raise ConfigError(
            f"{CONFIG}.kda_layers: expected the KDA layers counted from 1 (1 to {layers}), got "
            f"{listed!r}",
            field=f"{CONFIG}.kda_layers",
        )
    full = config.get("full_attn_layers")
    if not isinstance(full, list):
        raise ConfigError(
            f"{CONFIG}.full_attn_layers: expected the MLA layers counted from 1 (vLLM's "
            f"KimiLinearConfig requires the list), got {full!r}",
            field=f"{CONFIG}.full_attn_layers",
        )
    both = sorted(set(listed) & set(full))
    if both:
        raise ConfigError(
            f"{CONFIG}.full_attn_layers: layer {both[0]} (counted from 1) is listed as KDA and as "
            "MLA; vLLM builds it as KDA, so the config contradicts itself",
            field=f"{CONFIG}.full_attn_layers",
        )
    return {n - 1 for n in listed}


def read_kimi_linear(fields: base.Fields, layers: int) -> base.Layout:
    config = _config(fields)
    # The config's entries under their dotted names, so that a refusal names the entry.
    scoped = {f"{CONFIG}.{key}": value for key, value in config.items()}
    for name, value in ((f"{CONFIG}.use_full_rank_gate", config.get("use_full_rank_gate")),
                        ("dsa_config", fields.get("dsa_config"))):
        if value:
            raise ConfigError(
                f"{name}: a Kimi-K3 variant (vLLM's KimiK3DeltaAttention or DSA layers), whose "
                "layers the Kimi-Linear reader does not lay out; refusing rather than guessing",
                field=name,
            )
    kda = _kda_layers(config, layers)
    kinds: list[LayerKind] = ["linear" if i in kda else "mla" for i in range(layers)]
    geometry = KdaGeometry(
        num_heads=base.positive(scoped, f"{CONFIG}.num_heads", "KDA heads"),
        head_dim=base.positive(scoped, f"{CONFIG}.head_dim", "KDA head size"),
        conv_kernel=base.positive(scoped, f"{CONFIG}.short_conv_kernel_size", "KDA conv kernel"),
        source=f"{CONFIG}: num_heads, head_dim, short_conv_kernel_size",
    )
    overrides = ({} if fields.get("max_position_embeddings") is not None
                 else {"max_position_embeddings": VLLM_MAX_POSITIONS})
    return base.Layout(kinds, ("kv_lora_rank", CONFIG), geometry, NAMES, overrides)


KIMI_LINEAR = base.Family(
    name="kimi_linear",
    model_types=("kimi_linear",),
    architectures=("KimiLinearForCausalLM",),
    read=read_kimi_linear,
    vllm="models/kimi_k3/nvidia/model.py, layers/mamba/gdn/kimi_gdn_linear_attn.py",
    sglang=base.SGLangRule(refusal=(
        "SGLang 0.5.23 serves Kimi-Linear (srt/models/kimi_linear.py) with KDA states of three "
        "conv states (q, k, v) and a recurrent one beside an MLA pool, which the SGLang target "
        "does not plan (it plans MLA and Mamba-style states apart)")),
)
