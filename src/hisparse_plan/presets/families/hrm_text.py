"""HRM-Text (`hrm_text`): two stacks of decoder layers run in recurrence, each run of a layer
keeping a cache of its own.

vLLM 0.34's `models/hrm_text.py`: an L stack and an H stack of `num_layers_per_stack` layers
each; the model runs `H_cycles` high cycles, each `L_cycles` steps of the L stack then one of
the H stack (step `h * (L_cycles + 1) + l` for the L stack, `h * (L_cycles + 1) + L_cycles` for
the H stack). `HrmTextAttention` builds one full-attention layer for every step its stack runs
at, named `model.{L,H}_module.layers.{step * num_layers_per_stack + i}.self_attn.attn` for the
stack's layer i: the L stack's layers first, each layer's steps in order, then the H stack's.
Every layer keeps one KV head per query head, `num_attention_heads` of `head_dim` elements,
whatever `num_key_value_heads` says (`HrmTextAttention` sets `total_num_kv_heads` so: the
recurrence kernels take no GQA).

transformers' HrmTextConfig takes `num_hidden_layers` as the per-stack count where the config
has no `num_layers_per_stack` and rewrites it to the count of caches; the reader does the same.
"""

from __future__ import annotations

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.layer_count import MAX_LAYERS
from hisparse_plan.presets.regular import LayerKind

H_CYCLES = 2
L_CYCLES = 3
"""transformers' HrmTextConfig defaults."""


def hrm_attention_names(per_stack: int, high: int, low: int) -> list[str]:
    """The caches `HrmTextAttention` builds, in vLLM's order (`models/hrm_text.py`)."""
    low_steps = [h * (low + 1) + step for h in range(high) for step in range(low)]
    high_steps = [h * (low + 1) + low for h in range(high)]
    return [f"model.{stack}_module.layers.{step * per_stack + i}.self_attn.attn"
            for stack, steps in (("L", low_steps), ("H", high_steps))
            for i in range(per_stack) for step in steps]


def _count(fields: base.Fields, name: str, default: int) -> int:
    if fields.get(name) is None:
        return default
    return base.positive(fields, name, "HRM-Text's recurrence runs its stacks so many times")


def read_hrm_text(fields: base.Fields, layers: int) -> base.Layout:
    high, low = _count(fields, "H_cycles", H_CYCLES), _count(fields, "L_cycles", L_CYCLES)
    per_stack = _count(fields, "num_layers_per_stack", layers)
    total = per_stack * high * (low + 1)
    if total > MAX_LAYERS:
        raise ConfigError(
            f"num_layers_per_stack: HRM-Text keeps num_layers_per_stack * H_cycles * (L_cycles "
            f"+ 1) caches; expected at most {MAX_LAYERS}, got {total}",
            field="num_layers_per_stack")
    kinds: list[LayerKind] = ["full"] * total
    heads = base.positive(fields, "num_attention_heads", "HRM-Text keeps a KV head for each")
    return base.Layout(kinds, (), names={"per_layer": hrm_attention_names(per_stack, high, low)},
                       fields={"num_hidden_layers": total, "num_key_value_heads": heads})


HRM_TEXT = base.Family(
    name="hrm_text",
    model_types=("hrm_text",),
    architectures=("HrmTextForCausalLM",),
    read=read_hrm_text,
    vllm="models/hrm_text.py",
)
