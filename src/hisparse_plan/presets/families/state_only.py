"""Models of Mamba layers alone, no attention: every decoder layer one state (`mamba_states`).

- `mamba`, `falcon_mamba`: vLLM 0.34's `models/mamba.py` (`MambaForCausalLM`, which also
  serves `FalconMambaForCausalLM`): layer i is a Mamba-1 mixer `backbone.layers.{i}.mixer` of
  `intermediate_size` (transformers' MambaConfig and FalconMambaConfig set it to `expand x
  hidden_size`), `state_size` and `conv_kernel`.
- `mamba2`: vLLM's `models/mamba2.py`: layer i is a Mamba-2 mixer `backbone.layers.{i}.mixer`
  of `intermediate_size` where the config has one, else `expand x hidden_size` (the mixer's
  own argument), `n_groups`, `num_heads`, `head_dim`, `state_size`, `conv_kernel`.

Neither reads a head count: vLLM plans no attention for them (without a context length in the
config, vLLM's `_get_and_verify_max_len` takes the chosen max_model_len as it is, else 2048
tokens, as for any model: `aliases.with_vllm_length`). SGLang 0.5.23 serves them too
(`srt/models/mamba.py`, `falcon_mamba.py`, `mamba2.py`), but the SGLang target does not lay
out a pool of Mamba states alone yet: refused.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.families import base
from hisparse_plan.presets.mamba_states import MambaGeometry

NAMES: Final = {"mamba": "backbone.layers.{i}.mixer"}
SGLANG: Final = base.SGLangRule(
    refusal="the SGLang target does not lay out a model of Mamba layers alone (no attention) "
            "yet, though SGLang 0.5.23 serves it (srt/models/mamba.py, falcon_mamba.py, "
            "mamba2.py)")


def _no_attention(fields: base.Fields) -> dict[str, object]:
    """No heads (no attention layer); a config without a length has vLLM's
    (`aliases.with_vllm_length`)."""
    del fields
    return {"num_attention_heads": None, "num_key_value_heads": None}


def read_mamba1(fields: base.Fields, layers: int) -> base.Layout:
    if "intermediate_size" in fields:
        width = base.positive(fields, "intermediate_size", "Mamba-1's mixer width")
    else:  # transformers' MambaConfig sets it so when the file does not
        width = base.positive(fields, "expand", "Mamba-1's expansion") * base.positive(
            fields, "hidden_size", "Mamba-1's width is expand x hidden_size")
    geometry = MambaGeometry(
        version=1,
        intermediate_size=width,
        state_size=base.positive(fields, "state_size", "Mamba-1's state size"),
        conv_kernel=base.positive(fields, "conv_kernel", "Mamba-1's conv kernel"),
        source="intermediate_size, state_size, conv_kernel",
    )
    return base.Layout(["mamba"] * layers, (), geometry, NAMES, _no_attention(fields))


def read_mamba2(fields: base.Fields, layers: int) -> base.Layout:
    if fields.get("intermediate_size") is not None:
        width = base.positive(fields, "intermediate_size", "Mamba-2's mixer width")
    else:
        width = base.positive(fields, "expand", "Mamba-2's expansion") * base.positive(
            fields, "hidden_size", "Mamba-2's width is expand x hidden_size")
    geometry = MambaGeometry(
        version=2,
        intermediate_size=width,
        n_groups=base.positive(fields, "n_groups", "Mamba-2's groups"),
        num_heads=base.positive(fields, "num_heads", "Mamba-2's heads"),
        head_dim=base.positive(fields, "head_dim", "Mamba-2's head size"),
        state_size=base.positive(fields, "state_size", "Mamba-2's state size"),
        conv_kernel=base.positive(fields, "conv_kernel", "Mamba-2's conv kernel"),
        source="intermediate_size or expand, n_groups, num_heads, head_dim, state_size",
    )
    no_attention = {**_no_attention(fields), "head_dim": None}  # head_dim is the mixer's
    return base.Layout(["mamba"] * layers, (), geometry, NAMES, no_attention)


MAMBA1 = base.Family(
    name="mamba1",
    model_types=("mamba", "falcon_mamba"),
    architectures=("MambaForCausalLM", "FalconMambaForCausalLM"),
    read=read_mamba1,
    vllm="models/mamba.py",
    sglang=SGLANG,
)
MAMBA2 = base.Family(
    name="mamba2",
    model_types=("mamba2",),
    architectures=("Mamba2ForCausalLM",),
    read=read_mamba2,
    vllm="models/mamba2.py",
    sglang=SGLANG,
)
