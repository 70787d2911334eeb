"""MiniCPM3: its config.json describes MLA (`kv_lora_rank`, `qk_rope_head_dim`), but vLLM 0.34's
`models/minicpm3.py` builds plain attention: `MiniCPM3Attention` decompresses the latent into
per-head K and V and keeps them in an `Attention` of `num_attention_heads` KV heads (its
`num_kv_heads` argument is the query heads, whatever `num_key_value_heads` says) of
`qk_nope_head_dim + qk_rope_head_dim` elements (V is padded to that width), named
`model.layers.{i}.self_attn.attn`, in every layer, no window. `kv_lora_rank` shapes only the
weights there: no latent row is cached. SGLang 0.5.23's `srt/models/minicpm3.py` runs it with
MLA: not planned for SGLang here.
"""

from __future__ import annotations

from hisparse_plan.presets.families import base


def read_minicpm3(fields: base.Fields, layers: int) -> base.Layout:
    heads = base.positive(fields, "num_attention_heads", "MiniCPM3's attention heads")
    head = base.positive(fields, "qk_nope_head_dim", "MiniCPM3's key width without rope") + (
        base.positive(fields, "qk_rope_head_dim", "MiniCPM3's rope width"))
    return base.Layout(["full"] * layers, ("kv_lora_rank",),
                       fields={"num_key_value_heads": heads, "head_dim": head})


MINICPM3 = base.Family(
    name="minicpm3",
    model_types=("minicpm3",),
    architectures=("MiniCPM3ForCausalLM",),
    read=read_minicpm3,
    vllm="models/minicpm3.py",
    sglang=base.SGLangRule(refusal="SGLang 0.5.23's minicpm3.py keeps MLA latent rows where "
                                   "vLLM keeps per-head K and V; the SGLang target does not "
                                   "lay MiniCPM3 out yet"),
)
