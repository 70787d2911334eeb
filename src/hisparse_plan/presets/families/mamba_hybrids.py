"""Mamba hybrids: attention layers among Mamba layers, each Mamba layer one state of a conv and
a temporal part (`mamba_states.MambaGeometry`, in vLLM's `MambaStateShapeCalculator` shapes).

- `jamba`: vLLM 0.34's `models/jamba.py`: layer i is attention (`model.layers.{i}.attn`) when
  `i % attn_layer_period == attn_layer_offset`, else a Mamba-1 mixer (`model.layers.{i}.mixer`,
  `mamba_expand x hidden_size` wide, `mamba_d_state`, `mamba_d_conv`). SGLang 0.5.23 has no
  Jamba model class: refused for SGLang.
- `nemotron_h`: vLLM's `models/nemotron_h.py`: `hybrid_override_pattern`, one character a
  layer (`M` Mamba-2 `model.layers.{i}.mixer`, `*` attention `model.layers.{i}.mixer.attn`,
  `-` MLP and `E` MoE without a cache), else `layer_types`; Mamba-2 of `mamba_num_heads x
  mamba_head_dim`, `n_groups`, `ssm_state_size`, `conv_kernel`, the temporal state float32
  (vLLM's NemotronHForCausalLMConfig). SGLang's `srt/models/nemotron_h.py`: Mamba pool.
- `falcon_h1`: vLLM's `models/falcon_h1.py`: every layer runs attention
  (`model.layers.{i}.attn`) and a Mamba-2 mixer side by side, the mixer named
  `model.{num_hidden_layers + i}.mixer`. SGLang's `srt/models/falcon_h1.py`: Mamba pool.
- `granite_hybrid` (Granite-4.0-H): vLLM's `models/granitemoehybrid.py`: `layer_types`
  (`mamba` / `attention`, which transformers renames `linear_attention` / `full_attention`):
  a Mamba-2 mixer (`model.layers.{i}.mixer`, `mamba_expand x hidden_size` wide over
  `mamba_n_heads` heads of `mamba_d_head`, `mamba_n_groups`, `mamba_d_state`, `mamba_d_conv`,
  both states in the model dtype) or attention (`model.layers.{i}.self_attn.attn`, heads
  `hidden_size / num_attention_heads` wide whatever `head_dim` says). SGLang's
  `srt/models/granitemoehybrid.py`: Mamba pool.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.dtypes import DTYPE_SIZE
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.mamba_states import MambaGeometry
from hisparse_plan.presets.regular import LayerKind

NEMOTRON_H_SSM_DTYPE: Final = "float32"
"""vLLM's default Mamba state dtype for Nemotron-H (NemotronHForCausalLMConfig)."""
NEMOTRON_H_KINDS: Final[dict[str, LayerKind]] = {"M": "mamba", "*": "full", "-": "none",
                                                 "E": "none"}
NEMOTRON_H_TYPES: Final[dict[str, LayerKind]] = {
    "mamba": "mamba", "attention": "full", "full_attention": "full", "mlp": "none",
    "moe": "none", "linear_attention": "mamba",
}
GRANITE_TYPES: Final[dict[str, LayerKind]] = {
    "mamba": "mamba", "linear_attention": "mamba", "attention": "full",
    "full_attention": "full",
}


def read_jamba(fields: base.Fields, layers: int) -> base.Layout:
    period = base.integer(fields, "attn_layer_period", "Jamba's attention layer period")
    offset = base.integer(fields, "attn_layer_offset", "Jamba's attention layer offset")
    if period == 0 or offset >= period:
        raise ConfigError(
            f"attn_layer_offset: expected below attn_layer_period ({period}), got {offset}",
            field="attn_layer_offset",
        )
    kinds: list[LayerKind] = ["full" if i % period == offset else "mamba" for i in range(layers)]
    hidden = base.integer(fields, "hidden_size",
                          "Jamba's Mamba width is mamba_expand x hidden_size")
    geometry = MambaGeometry(
        version=1,
        intermediate_size=base.integer(fields, "mamba_expand", "Jamba's Mamba expansion") * hidden,
        state_size=base.integer(fields, "mamba_d_state", "Jamba's Mamba state size"),
        conv_kernel=base.integer(fields, "mamba_d_conv", "Jamba's Mamba conv kernel"),
        source="mamba_expand, mamba_d_state, mamba_d_conv",
    )
    return base.Layout(kinds, ("attn_layer_period", "attn_layer_offset", "layers_block_type",
                          "layer_types", "sliding_window"), geometry,
                  {"attention": "model.layers.{i}.attn"})


def read_nemotron_h(fields: base.Fields, layers: int) -> base.Layout:
    if base.given(fields, "hybrid_override_pattern"):
        pattern = base.layer_list(fields, "hybrid_override_pattern", layers)
        odd = sorted(set(pattern) - set(NEMOTRON_H_KINDS))
        if odd:
            raise ConfigError(
                f"hybrid_override_pattern: expected M (Mamba), * (attention), - (MLP) or E "
                f"(MoE) per layer, got {', '.join(odd)}",
                field="hybrid_override_pattern",
            )
        kinds = [NEMOTRON_H_KINDS[c] for c in pattern]
    else:
        if not base.given(fields, "layer_types") and base.given(fields, "layers_block_type"):
            # transformers 5's NemotronHConfig keeps layer_types as layers_block_type (its
            # attribute_map), the only per-layer field its to_dict writes.
            fields = {**fields, "layer_types": fields["layers_block_type"]}
        kinds = base.from_layer_types(fields, layers, NEMOTRON_H_TYPES, "Nemotron-H")
    heads = base.integer(fields, "mamba_num_heads", "Nemotron-H's Mamba heads")
    head_dim = base.integer(fields, "mamba_head_dim", "Nemotron-H's Mamba head size")
    ssm_dtype = fields.get("mamba_ssm_cache_dtype") or NEMOTRON_H_SSM_DTYPE
    if ssm_dtype not in DTYPE_SIZE:
        raise ConfigError(
            f"mamba_ssm_cache_dtype: expected one of {', '.join(DTYPE_SIZE)}, got {ssm_dtype!r}",
            field="mamba_ssm_cache_dtype",
        )
    geometry = MambaGeometry.model_validate({
        "version": 2,
        "intermediate_size": heads * head_dim,
        "n_groups": base.integer(fields, "n_groups", "Nemotron-H's Mamba groups"),
        "num_heads": heads,
        "head_dim": head_dim,
        "state_size": base.integer(fields, "ssm_state_size", "Nemotron-H's Mamba state size"),
        "conv_kernel": base.integer(fields, "conv_kernel", "Nemotron-H's Mamba conv kernel"),
        "ssm_dtype": ssm_dtype,
        "source": "mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size, conv_kernel",
    })
    return base.Layout(kinds, ("hybrid_override_pattern", "layer_types", "layers_block_type",
                          "sliding_window"), geometry,
                  {"attention": "model.layers.{i}.mixer.attn"})


def read_falcon_h1(fields: base.Fields, layers: int) -> base.Layout:
    d_ssm = fields.get("mamba_d_ssm")
    intermediate = (
        d_ssm if isinstance(d_ssm, int) and d_ssm > 0
        else base.integer(fields, "mamba_expand", "Falcon-H1's Mamba width without mamba_d_ssm")
        * base.integer(fields, "hidden_size", "Falcon-H1's Mamba width")
    )
    geometry = MambaGeometry(
        version=2,
        intermediate_size=intermediate,
        n_groups=base.integer(fields, "mamba_n_groups", "Falcon-H1's Mamba groups"),
        num_heads=base.integer(fields, "mamba_n_heads", "Falcon-H1's Mamba heads"),
        head_dim=base.integer(fields, "mamba_d_head", "Falcon-H1's Mamba head size"),
        state_size=base.integer(fields, "mamba_d_state", "Falcon-H1's Mamba state size"),
        conv_kernel=base.integer(fields, "mamba_d_conv", "Falcon-H1's Mamba conv kernel"),
        source="mamba_d_ssm, mamba_n_groups, mamba_n_heads, mamba_d_head, mamba_d_state",
    )
    # vLLM names the Mamba mixer of layer i `model.{num_hidden_layers + i}.mixer`.
    return base.Layout(["full_and_mamba"] * layers, ("layers_block_type", "layer_types",
                                               "sliding_window"), geometry,
                  {"attention": "model.layers.{i}.attn", "mamba": "model.{ni}.mixer"})


def read_granite_hybrid(fields: base.Fields, layers: int) -> base.Layout:
    if not base.given(fields, "layer_types") and base.given(fields, "layers_block_type"):
        fields = {**fields, "layer_types": fields["layers_block_type"]}
    kinds = base.from_layer_types(fields, layers, GRANITE_TYPES, "Granite-4.0-H")
    hidden = base.integer(fields, "hidden_size",
                          "Granite's Mamba width is mamba_expand x hidden_size")
    intermediate = base.integer(fields, "mamba_expand", "Granite's Mamba expansion") * hidden
    heads = base.integer(fields, "mamba_n_heads", "Granite's Mamba heads")
    head_dim = fields.get("mamba_d_head", "auto")
    geometry = MambaGeometry(
        version=2,
        intermediate_size=intermediate,
        n_groups=base.integer(fields, "mamba_n_groups", "Granite's Mamba groups"),
        num_heads=heads,
        # transformers' "auto" (its default): the width over the heads.
        head_dim=intermediate // max(heads, 1) if head_dim == "auto" else base.integer(
            fields, "mamba_d_head", "Granite's Mamba head size"),
        state_size=base.integer(fields, "mamba_d_state", "Granite's Mamba state size"),
        conv_kernel=base.integer(fields, "mamba_d_conv", "Granite's Mamba conv kernel"),
        source="mamba_expand, mamba_n_heads, mamba_d_head, mamba_n_groups, mamba_d_state",
    )
    return base.Layout(kinds, ("layer_types", "layers_block_type", "sliding_window"), geometry,
                  fields={"head_dim": None})


JAMBA = base.Family(
    name="jamba",
    model_types=("jamba",),
    architectures=("JambaForCausalLM",),
    read=read_jamba,
    vllm="models/jamba.py",
    sglang=base.SGLangRule(refusal="SGLang 0.5.23 has no model class for Jamba "
                              "(JambaForCausalLM is not in its registry)"),
)
NEMOTRON_H = base.Family(
    name="nemotron_h",
    model_types=("nemotron_h",),
    architectures=("NemotronHForCausalLM",),
    read=read_nemotron_h,
    vllm="models/nemotron_h.py",
)
FALCON_H1 = base.Family(
    name="falcon_h1",
    model_types=("falcon_h1",),
    architectures=("FalconH1ForCausalLM",),
    read=read_falcon_h1,
    vllm="models/falcon_h1.py",
)
GRANITE_HYBRID = base.Family(
    name="granite_hybrid",
    model_types=("granitemoehybrid",),
    architectures=("GraniteMoeHybridForCausalLM",),
    read=read_granite_hybrid,
    vllm="models/granitemoehybrid.py",
)
