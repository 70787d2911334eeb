"""Zamba2: Mamba-2 layers, some of them ("hybrid") also running one of `num_mem_blocks`
attention blocks whose weights are shared between positions, each position with a cache of its
own. vLLM 0.34's `models/zamba2.py`:

- layer i is hybrid where `layers_block_type[i] == "hybrid"` (transformers writes the older
  "mamba" as "linear_attention"; vLLM tests for "hybrid" only), else a Mamba-2 layer; every layer
  has a Mamba-2 mixer named `{H + i}.mixer`, H the number of hybrid layers (vLLM prefixes the
  layers so to keep the names apart from the blocks');
- the k-th hybrid layer runs block `k % num_mem_blocks`, whose Attention for it is named
  `model.attn.{j}`, `j = b * (H + M - 1) // M + k // M` (b the block, M `num_mem_blocks`); the
  blocks are built before the layers, so their caches come first, in j order;
- attention: `num_attention_heads` KV heads (Attention is given no KV head count) of
  `attention_head_dim`, which transformers' Zamba2Config always derives as `2 * hidden_size /
  num_attention_heads`; no window;
- the Mamba-2 mixer: `mamba_expand x hidden_size` wide, `n_mamba_heads` heads of that width
  over the heads, `mamba_ngroups`, `mamba_d_state`, `mamba_d_conv`, both states in the model
  dtype.

vLLM's Zamba2ForCausalLM has no pipeline parallelism. SGLang 0.5.23 has no Zamba2 model class.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.mamba_states import MambaGeometry
from hisparse_plan.presets.regular import LayerKind

HYBRID: Final = "hybrid"


def attention_slots(hybrid: list[int], blocks: int) -> dict[int, int]:
    """Decoder layer -> j of its cache `model.attn.{j}`, as vLLM's Zamba2Attention numbers
    them (`hybrid`: the hybrid layers in order, `blocks`: num_mem_blocks)."""
    count = len(hybrid)
    return {layer: k % blocks * (count + blocks - 1) // blocks + k // blocks
            for k, layer in enumerate(hybrid)}


def read_zamba2(fields: base.Fields, layers: int) -> base.Layout:
    name = "layers_block_type" if base.given(fields, "layers_block_type") else "layer_types"
    types = base.layer_list(fields, name, layers)
    kinds: list[LayerKind] = ["full_and_mamba" if t == HYBRID else "mamba" for t in types]
    hybrid = [i for i, kind in enumerate(kinds) if kind == "full_and_mamba"]
    blocks = base.positive(fields, "num_mem_blocks", "Zamba2's shared attention blocks")
    heads = base.positive(fields, "num_attention_heads", "Zamba2's attention heads")
    hidden = base.positive(fields, "hidden_size", "Zamba2's widths follow hidden_size")
    if 2 * hidden % heads:
        raise ConfigError(
            f"num_attention_heads: Zamba2's attention is 2 * hidden_size ({2 * hidden}) wide "
            f"over its heads; expected a divisor of it, got {heads}", field="num_attention_heads")
    width = base.positive(fields, "mamba_expand", "Zamba2's Mamba expansion") * hidden
    mamba_heads = base.positive(fields, "n_mamba_heads", "Zamba2's Mamba heads")
    geometry = MambaGeometry(
        version=2,
        intermediate_size=width,
        n_groups=base.positive(fields, "mamba_ngroups", "Zamba2's Mamba groups"),
        num_heads=mamba_heads,
        head_dim=width // mamba_heads,
        state_size=base.positive(fields, "mamba_d_state", "Zamba2's Mamba state size"),
        conv_kernel=base.positive(fields, "mamba_d_conv", "Zamba2's Mamba conv kernel"),
        source="mamba_expand, n_mamba_heads, mamba_ngroups, mamba_d_state, mamba_d_conv",
    )
    names = {"attention": "model.attn.{a}", "mamba": "{hi}.mixer", "offset": len(hybrid),
             "attention_slots": attention_slots(hybrid, blocks)}
    overrides = {"num_key_value_heads": heads, "head_dim": 2 * hidden // heads}
    return base.Layout(kinds, ("layers_block_type", "layer_types", "hybrid_layer_ids"),
                       geometry, names, overrides)


ZAMBA2 = base.Family(
    name="zamba2",
    model_types=("zamba2",),
    architectures=("Zamba2ForCausalLM",),
    read=read_zamba2,
    vllm="models/zamba2.py",
    sglang=base.SGLangRule(refusal="SGLang 0.5.23 has no model class for Zamba2 "
                                   "(Zamba2ForCausalLM is not in its registry)"),
)
