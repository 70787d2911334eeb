"""Multi-head latent attention families.

- `mla` (DeepSeek-V2/V3/R1, Kimi-K2, GLM-4.7-Flash, A.X K1): vLLM 0.34's
  `models/deepseek_v2.py` (`DeepseekV2MLAAttention`), `models/glm4_moe_lite.py` (the same
  attention) and `models/AXK1.py` (`AXK1MLAAttention`, picked when vLLM's `use_mla`, which
  `is_deepseek_mla` sets for model_type `axk1` with a `kv_lora_rank`) build one MLA
  layer a decoder layer, `model.layers.{i}.self_attn.attn`: one latent row of `kv_lora_rank +
  qk_rope_head_dim` elements a token (576 for all of these), one "head", the same on every
  tensor-parallel rank, in the model dtype. SGLang 0.5.23's `srt/models/deepseek_v2.py` and
  `glm4_moe_lite.py` keep the rows in its MLA pool.
- `sparse_mla` (DeepSeek-V3.2, GLM-5): MLA with an indexer; read as a sparse-MLA model of its
  own (`architecture.ModelArchitecture`), not by a layer rule. vLLM's `models/deepseek_v32/`,
  SGLang's `deepseek_v2.py` and `glm4_moe.py` (DSA pools).
- `deepseek_v4` (DeepSeek-V4): compressed and sliding-window MLA caches per `compress_ratios`;
  read from its own fields (`regular.RegularArchitecture.compressed_mla`,
  `deepseek_v4_request`). vLLM's `models/deepseek_v4/`, SGLang's `deepseek_v4.py`.
"""

from __future__ import annotations

from hisparse_plan.presets.families import base


def read_mla(fields: base.Fields, layers: int) -> base.Layout:
    return base.Layout(["mla"] * layers, ("kv_lora_rank",))


MLA = base.Family(
    name="mla",
    model_types=("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe_lite", "axk1"),
    architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM",
                   "AXK1ForCausalLM"),
    read=read_mla,
    vllm="models/deepseek_v2.py, models/glm4_moe_lite.py, models/AXK1.py",
)
SPARSE_MLA = base.Family(
    name="sparse_mla",
    model_types=("deepseek_v32", "glm_moe_dsa"),
    architectures=("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"),
    read=None,
    vllm="models/deepseek_v32/",
)
DEEPSEEK_V4 = base.Family(
    name="deepseek_v4",
    model_types=("deepseek_v4",),
    architectures=("DeepseekV4ForCausalLM",),
    read=None,
    vllm="models/deepseek_v4/",
)
