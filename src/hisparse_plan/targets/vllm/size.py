"""Pipeline stages, each group projected onto them, and bytes per block per stage (SPEC 5.8, 7.4,
7.6)."""

from __future__ import annotations

from dataclasses import dataclass

from hisparse_plan.errors import PlanError
from hisparse_plan.models import DeviceConfig
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import Layer, PlannedGroup
from hisparse_plan.targets.vllm.rules.block_bytes import bytes_per_block
from hisparse_plan.targets.vllm.rules.buckets import SpecBucket, stage_buckets
from hisparse_plan.targets.vllm.rules.pool_memory import pool_blocks, pool_memory, usable_bytes


@dataclass(frozen=True, slots=True)
class StageSizing:
    """One pipeline stage's pool, before num_blocks is known."""

    index: int
    layers: list[str] | None
    """The stage's layers; None when one stage holds every layer."""
    groups: list[list[SpecBucket]]
    """Every device group's buckets projected onto this stage (empty for a group it lacks)."""
    available_bytes: int
    bytes_per_block: int
    num_blocks_override: int | None

    @property
    def memory(self) -> int:
        return pool_memory(self.available_bytes, self.bytes_per_block, self.num_blocks_override)

    @property
    def usable(self) -> int:
        return usable_bytes(self.available_bytes, self.bytes_per_block, self.num_blocks_override)

    @property
    def fitting_blocks(self) -> int:
        return pool_blocks(self.available_bytes, self.bytes_per_block, self.num_blocks_override)


def size_stages(
    device: DeviceConfig, groups: list[PlannedGroup], layers: list[Layer], trace: Trace
) -> list[StageSizing]:
    """Each stage's projected groups and bytes per block, in stage order."""
    layout = device.kv_cache_layout
    if device.pipeline_stages is None:
        stages: list[tuple[list[str] | None, int]] = [(None, device.available_bytes)]
    else:
        check_stages(device, layers)
        stages = [(stage.layers, stage.available_bytes) for stage in device.pipeline_stages]
    sized = []
    for index, (names, available) in enumerate(stages):
        projected = (
            [group.buckets for group in groups] if names is None
            else project(groups, set(names))
        )
        per_block = bytes_per_block(projected, layout)
        if trace.enabled:
            trace.add("size", "5.8 / 7.4", f"device_pools[{index}].bytes_per_block", per_block,
                      f"widest of {len(projected)} groups' block bytes in {layout.value}, "
                      "aligned")
        sized.append(StageSizing(
            index, names, projected, available, per_block, device.num_blocks_override,
        ))
    return sized


def check_stages(device: DeviceConfig, layers: list[Layer]) -> None:
    """Every layer in exactly one stage; every listed name a layer (SPEC 4.1)."""
    stages = device.pipeline_stages or []
    known = {name for name, _ in layers}
    owner: dict[str, int] = {}
    for index, stage in enumerate(stages):
        field = f"device.pipeline_stages[{index}].layers"
        for name in stage.layers:
            if name not in known:
                raise PlanError(
                    f"{field}: {name!r} is not a layer of the request; expected names from "
                    "`layers`",
                    field=field,
                )
            if name in owner:
                raise PlanError(
                    f"{field}: {name!r} is also in stage {owner[name]}; expected every layer in "
                    "exactly one stage",
                    field=field,
                )
            owner[name] = index
    missing = next((name for name, _ in layers if name not in owner), None)
    if missing is not None:
        raise PlanError(
            f"device.pipeline_stages: layer {missing!r} is in no stage; expected every layer "
            "in exactly one stage",
            field="device.pipeline_stages",
        )


def project(groups: list[PlannedGroup], names: set[str]) -> list[list[SpecBucket]]:
    """Each group kept with only the stage's layers (SPEC 7.6 step 2): a group that holds none
    of them stays, with no layers and no tensor, as in vLLM 0.34."""
    return [stage_buckets(group.group.spec, group.group.layer_names, names) for group in groups]
