"""The recurrent states of a state layer (what vLLM 0.34 calls a Mamba layer, `MambaBase`) on
one tensor-parallel rank, as vLLM's `MambaStateShapeCalculator` and `MambaStateDtypeCalculator`
size them (conv states in the default "SD" layout: state length first).

- Mamba-1 (Jamba): conv `[conv_kernel - 1, intermediate / tp]` and temporal
  `[intermediate / tp, state_size]`;
- Mamba-2 (Nemotron-H, Falcon-H1, Granite-4.0-H): with `g = n_groups`, raised to `tp` when tp
  does not divide it (the groups a head shard needs are replicated), conv `[conv_kernel - 1,
  (intermediate + 2 * g * state_size) / tp]` and temporal `[num_heads / tp, head_dim,
  state_size]`;
- Gated DeltaNet (Qwen3-Next, Qwen3.5): conv `[conv_kernel - 1, (2 * key_heads * key_head_dim
  + value_heads * value_head_dim) / tp]` and recurrent `[value_heads / tp, value_head_dim,
  key_head_dim]`;
- short convolution (LFM2): one conv state `[conv_kernel - 1, conv_dim / tp]`;
- Kimi Delta Attention (Kimi-Linear): conv `[conv_kernel - 1, 3 * heads * head_dim / tp]`
  (q, k and v side by side) and recurrent `[heads / tp, head_dim, head_dim]`;
- compressed convolutional attention (ZAYA1): see `CcaGeometry`.

Conv states are kept in the model dtype. The temporal (recurrent) state is in `ssm_dtype` where
one is set (float32 for Nemotron-H, a Qwen3.5 config's `mamba_ssm_dtype`), else the model dtype;
a KDA recurrent state is float32 always (vLLM's `kda_state_dtype` under `auto`).

`prefill_checkpoint` is how a layer exports prefix-cache checkpoints in align mode on Hopper:
`every_token` (a Mamba-2 mixer: one checkpoint block, any position), `gdn_grid` (FlashInfer's
Gated DeltaNet prefill: one block, on a 64-token grid) or `none` (the scheduler splits prefills).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hisparse_plan.models import DType
from hisparse_plan.presets.errors import ConfigError

PositiveInt = Annotated[int, Field(ge=1)]
Checkpoint = Literal["none", "every_token", "gdn_grid"]


class _Geometry(BaseModel):
    """What every state geometry shares: the config fields it was read from, and the division
    of a dimension over the tensor-parallel ranks (vLLM's `divide`, which asserts)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    source: str = "mamba"
    LABEL: ClassVar[str] = "state"
    """What the layers are called in a refusal."""

    @property
    def prefill_checkpoint(self) -> Checkpoint:
        return "none"

    def _divide(self, total: int, tp: int, what: str) -> int:
        if total % tp:
            raise ConfigError(
                f"tp: the {self.LABEL} {what} ({total}, from {self.source}) must be a multiple "
                f"of the tensor-parallel ranks ({tp})",
                field="tp",
            )
        return total // tp


class MambaGeometry(_Geometry):
    """What decides a Mamba layer's state sizes; `source` names the config fields read."""

    kind: Literal["mamba"] = "mamba"
    version: Literal[1, 2]
    intermediate_size: PositiveInt
    state_size: PositiveInt
    conv_kernel: PositiveInt
    n_groups: PositiveInt = 1
    num_heads: PositiveInt = 1
    head_dim: PositiveInt = 1
    ssm_dtype: DType = "bfloat16"
    LABEL: ClassVar[str] = "Mamba"

    @property
    def prefill_checkpoint(self) -> Checkpoint:
        """vLLM 0.34's MambaMixer2 exports a checkpoint at any position; MambaMixer none."""
        return "every_token" if self.version == 2 else "none"

    def extra_groups(self, tp: int) -> int:
        """Groups replicated so that every head shard has its group (vLLM's
        `extra_groups_for_head_shards`)."""
        return 0 if self.n_groups % tp == 0 else tp - self.n_groups

    def state_shapes(self, tp: int) -> list[list[int]]:
        """The conv and temporal states of one rank of `tp`."""
        if self.version == 1:
            conv_dim = self._divide(self.intermediate_size, tp, "intermediate size")
            return [[self.conv_kernel - 1, conv_dim], [conv_dim, self.state_size]]
        groups = self.n_groups + self.extra_groups(tp)
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        return [
            [self.conv_kernel - 1, self._divide(conv_dim, tp, "conv dimension")],
            [self._divide(self.num_heads, tp, "heads"), self.head_dim, self.state_size],
        ]

    def state_dtypes(self, model_dtype: DType) -> list[DType]:
        return [model_dtype, self.ssm_dtype]

    def conv_blocks(self) -> tuple[int, ...]:
        """The conv state's channel blocks, each sharded over the ranks on its own (a
        transfer between TP sizes, `Instance.state_groups`): Mamba-1's x; Mamba-2's x, B, C
        (vLLM's `derive_mamba_conv_split`)."""
        if self.version == 1:
            return (self.intermediate_size,)
        return (self.intermediate_size, self.n_groups * self.state_size,
                self.n_groups * self.state_size)


class GatedDeltaNetGeometry(_Geometry):
    """A Gated DeltaNet linear-attention layer (Qwen3-Next, Qwen3.5)."""

    kind: Literal["gated_delta_net"] = "gated_delta_net"
    num_key_heads: PositiveInt
    num_value_heads: PositiveInt
    key_head_dim: PositiveInt
    value_head_dim: PositiveInt
    conv_kernel: PositiveInt
    ssm_dtype: DType | None = None

    @property
    def prefill_checkpoint(self) -> Checkpoint:
        return "gdn_grid"

    def state_shapes(self, tp: int) -> list[list[int]]:
        """The conv and recurrent states of one rank of `tp`: both follow the heads, so the
        heads are what must divide."""
        for field, total in (("linear_num_value_heads", self.num_value_heads),
                             ("linear_num_key_heads", self.num_key_heads)):
            if total % tp:
                raise ConfigError(
                    f"tp: {field} ({total}) must be a multiple of the tensor-parallel ranks "
                    f"({tp})",
                    field="tp",
                )
        conv_dim = 2 * self.num_key_heads * self.key_head_dim + (
            self.num_value_heads * self.value_head_dim)
        return [[self.conv_kernel - 1, conv_dim // tp],
                [self.num_value_heads // tp, self.value_head_dim, self.key_head_dim]]

    def state_dtypes(self, model_dtype: DType) -> list[DType]:
        return [model_dtype, self.ssm_dtype or model_dtype]

    def conv_blocks(self) -> tuple[int, ...]:
        """q, k and v, each sharded on its own (SGLang's `conv_shard_groups`)."""
        keys = self.num_key_heads * self.key_head_dim
        return (keys, keys, self.num_value_heads * self.value_head_dim)


class ShortConvGeometry(_Geometry):
    """A short-convolution layer (LFM2's `ShortConv`): one conv state, no recurrent one."""

    kind: Literal["short_conv"] = "short_conv"
    conv_dim: PositiveInt
    conv_kernel: PositiveInt
    LABEL: ClassVar[str] = "short-convolution"

    def state_shapes(self, tp: int) -> list[list[int]]:
        return [[self.conv_kernel - 1, self._divide(self.conv_dim, tp, "conv dimension")]]

    def state_dtypes(self, model_dtype: DType) -> list[DType]:
        return [model_dtype]

    def conv_blocks(self) -> tuple[int, ...]:
        """One block of channels."""
        return (self.conv_dim,)


class KdaGeometry(_Geometry):
    """A Kimi Delta Attention layer (Kimi-Linear's `KimiGatedDeltaNetAttention`)."""

    kind: Literal["kda"] = "kda"
    num_heads: PositiveInt
    head_dim: PositiveInt
    conv_kernel: PositiveInt
    LABEL: ClassVar[str] = "KDA"

    def state_shapes(self, tp: int) -> list[list[int]]:
        heads = self._divide(self.num_heads, tp, "heads")
        return [[self.conv_kernel - 1, 3 * heads * self.head_dim],
                [heads, self.head_dim, self.head_dim]]

    def state_dtypes(self, model_dtype: DType) -> list[DType]:
        return [model_dtype, "float32"]

    def conv_blocks(self) -> tuple[int, ...]:
        """q, k and v side by side, each sharded on its own."""
        return (self.num_heads * self.head_dim,) * 3


class CcaGeometry(_Geometry):
    """ZAYA1's compressed convolutional attention (vLLM 0.34's `models/zaya.py`, `ZayaCCA`,
    `_cca_state_shapes`): the raw q/k projections' history `[(heads + kv_heads) * head_dim,
    cca_time0 + cca_time1 - 2]` and the previous token's delayed half of v `[kv_heads *
    head_dim / 2]`, the same on every rank (`is_kv_cache_tp_replicated`), both in the model
    dtype (`short_conv_state_dtype`)."""

    kind: Literal["cca"] = "cca"
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    time0: PositiveInt
    time1: PositiveInt
    LABEL: ClassVar[str] = "CCA"

    def state_shapes(self, tp: int) -> list[list[int]]:
        del tp  # replicated on every rank
        return [[(self.num_heads + self.num_kv_heads) * self.head_dim,
                 self.time0 + self.time1 - 2],
                [self.num_kv_heads * self.head_dim // 2]]

    def state_dtypes(self, model_dtype: DType) -> list[DType]:
        return [model_dtype, model_dtype]


StateGeometry = Annotated[
    MambaGeometry | GatedDeltaNetGeometry | ShortConvGeometry | KdaGeometry | CcaGeometry,
    Field(discriminator="kind"),
]
"""A state layer's geometry, by its kind."""
