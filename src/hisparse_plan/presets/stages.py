"""Pipeline stages as vLLM forms them: decoder layers split evenly across the stages.

vLLM 0.33's `get_pp_indices` gives each of `pp` partitions `num_layers // pp` decoder
layers and hands the remainder out one layer each to the partitions just before the last
(the second to last first, then the third to last, ...): the first partition holds the input
embedding and the last the output head, so both are kept light. 61 layers on 4 stages:
15, 15, 16, 15.
"""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.presets.errors import ConfigError


def pp_partition(num_layers: int, pp: int) -> list[int]:
    """Decoder layers per stage, in stage order."""
    if not 1 <= pp <= num_layers:
        raise ConfigError(
            f"pipeline stages: expected between 1 and the model's {num_layers} decoder layers, "
            f"got {pp}",
            field="device.pipeline_stages",
        )
    sizes = [num_layers // pp] * pp
    for back in range(2, num_layers % pp + 2):
        sizes[-back] += 1
    return sizes


def stage_layers(decoder_layers: Sequence[Sequence[str]], pp: int) -> list[list[str]]:
    """The cache layer names of each stage: each decoder layer's names stay on one stage."""
    stages = []
    start = 0
    for size in pp_partition(len(decoder_layers), pp):
        stages.append([name for layer in decoder_layers[start:start + size] for name in layer])
        start += size
    return stages
