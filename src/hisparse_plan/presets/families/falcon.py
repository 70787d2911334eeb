"""Falcon (the first generation, `model_type` "falcon"): vLLM 0.34's `models/falcon.py` builds
one Attention a layer, `transformer.h.{i}.self_attention.attn`, of heads `hidden_size /
num_attention_heads` wide, whose KV heads are `num_kv_heads` under `new_decoder_architecture`,
else 1 with `multi_query`, else every query head; no window. SGLang 0.5.23 has no Falcon model
class.
"""

from __future__ import annotations

from hisparse_plan.presets.families import base
from hisparse_plan.presets.families.layer_names import ATTENTION_BY_MODEL_TYPE


def read_falcon(fields: base.Fields, layers: int) -> base.Layout:
    heads = base.positive(fields, "num_attention_heads", "Falcon's attention heads")
    if fields.get("new_decoder_architecture"):
        kv_heads = base.positive(fields, "num_kv_heads", "Falcon's KV heads (new architecture)")
    elif fields.get("multi_query", True):  # transformers' FalconConfig defaults it on
        kv_heads = 1
    else:
        kv_heads = heads
    return base.Layout(["full"] * layers, (),
                       names={"attention": ATTENTION_BY_MODEL_TYPE["falcon"]},
                       fields={"num_key_value_heads": kv_heads, "head_dim": None})


FALCON = base.Family(
    name="falcon",
    model_types=("falcon",),
    architectures=("FalconForCausalLM",),
    read=read_falcon,
    vllm="models/falcon.py",
    sglang=base.SGLangRule(refusal="SGLang 0.5.23 has no model class for Falcon "
                                   "(FalconForCausalLM is not in its registry)"),
)
