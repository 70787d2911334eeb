"""A Mamba layer's states on one tensor-parallel rank, as vLLM 0.34's
`MambaStateShapeCalculator` sizes them (conv states in its default "SD" layout: state length
first).

- Mamba-1 (Jamba): conv `[conv_kernel - 1, intermediate / tp]` and temporal
  `[intermediate / tp, state_size]`;
- Mamba-2 (Nemotron-H, Falcon-H1): with `g = n_groups`, raised to `tp` when tp does not divide
  it (the groups a head shard needs are replicated), conv `[conv_kernel - 1,
  (intermediate + 2 * g * state_size) / tp]` and temporal `[num_heads / tp, head_dim,
  state_size]`.

The conv state is kept in the model dtype; the temporal (SSM) state in `ssm_dtype`: the model
dtype unless vLLM picks another for the model (float32 for Nemotron-H).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from hisparse_plan.models import DType
from hisparse_plan.presets.errors import ConfigError

PositiveInt = Annotated[int, Field(ge=1)]


class MambaGeometry(BaseModel):
    """What decides a Mamba layer's state sizes; `source` names the config fields read."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    version: Literal[1, 2]
    intermediate_size: PositiveInt
    state_size: PositiveInt
    conv_kernel: PositiveInt
    n_groups: PositiveInt = 1
    num_heads: PositiveInt = 1
    head_dim: PositiveInt = 1
    ssm_dtype: DType = "bfloat16"
    source: str = "mamba"

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

    def _divide(self, total: int, tp: int, what: str) -> int:
        if total % tp:
            raise ConfigError(
                f"tp: the Mamba {what} ({total}, from {self.source}) must be a multiple of the "
                f"tensor-parallel ranks ({tp})",
                field="tp",
            )
        return total // tp
