"""Admission: one max_model_len request must fit on every stage's GPU pool; auto-fit shortens
max_model_len until it does (SPEC 5.12, 7.6, 7.7, 7.8)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hisparse_plan.errors import CapacityError
from hisparse_plan.models import CrossAttentionSpec, Workload
from hisparse_plan.models.base import GIB
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import PlannedGroup
from hisparse_plan.targets.vllm.rules.required import buckets_required
from hisparse_plan.targets.vllm.rules.required import longest_fitting as longest_in
from hisparse_plan.targets.vllm.size import StageSizing


@dataclass(frozen=True, slots=True)
class Admission:
    max_model_len: int
    """The length the plan is sized for (the fitted one under auto-fit)."""
    fitted_max_model_len: int | None
    """Set when auto-fit was asked (SPEC 7.8)."""
    required: list[int]
    """Blocks one max_model_len request holds in each device group, in group order."""
    num_blocks: int
    """min over stages of the blocks each stage's memory holds (or the override)."""


def group_required(group: PlannedGroup, length: int, workload: Workload) -> int:
    return buckets_required(group.buckets, length, workload)


def admit(
    stages: list[StageSizing],
    groups: list[PlannedGroup],
    workload: Workload,
    *,
    auto_fit: bool,
    longest_for_host: int | None,
    trace: Trace,
) -> Admission:
    """Auto-fit if asked, then admit one request on every stage, in stage order.

    `longest_for_host` is the longest request the host pool holds (HiSparse), which bounds the
    length an admission error suggests.
    """
    length = workload.max_model_len

    def blocks(at: int) -> int:
        return sum(group_required(group, at, workload) for group in groups)

    fitted = None
    if auto_fit:
        fitted = min(longest_fitting(stage, blocks, length) for stage in stages)
        if longest_for_host is not None and longest_for_host < fitted:
            # vLLM's HiSparse search plans the host pool at each length it tries.
            fitted = longest_for_host
            if fitted == 0:
                raise CapacityError(
                    "hisparse.host_pool_gib: auto-fit found no length that fits: the host pool "
                    "holds no block beyond the null block and the copy-on-write tail",
                    field="hisparse.host_pool_gib",
                )
        trace.add("admit", "7.8", "fitted_max_model_len", fitted,
                  lambda: f"largest L <= {length} whose request fits every stage's usable bytes"
                  + ("" if longest_for_host is None else " and the host pool"))
        if fitted == 0:
            stage = min(stages, key=lambda s: longest_fitting(s, blocks, length))
            raise CapacityError(
                f"{_memory_field(stage)}: auto-fit found no length that fits: one request of a "
                f"single token needs {stage.bytes_per_block * blocks(1)} bytes on stage "
                f"{stage.index}, but {max(stage.usable, 0)} are usable; the model cannot serve "
                "a single token",
                field=_memory_field(stage),
            )
        length = fitted
    required = [group_required(group, length, workload) for group in groups]
    needed_blocks = sum(required)
    if trace.enabled:
        for index, (group, blocks_held) in enumerate(zip(groups, required, strict=True)):
            spec = group.group.spec
            # Cross-attention holds the encoder's budget, whatever the request's length.
            at = (f"for the encoder's {workload.max_num_batched_tokens} tokens "
                  "(max_num_batched_tokens), whatever L"
                  if isinstance(spec, CrossAttentionSpec) else f"at L = {length}")
            trace.add("admit", "5.10 / 7.7", f"required blocks of device group {index}",
                      blocks_held,
                      f"{spec.kind} group of {len(group.group.layer_names)} layer(s) {at}")
    for stage in stages:
        _admit_stage(stage, needed_blocks, length, blocks, longest_for_host)
    trace.add("admit", "5.12 / 7.7", "blocks per request", needed_blocks,
              lambda: f"sum of required over {len(groups)} device groups at L = {length}")
    num_blocks = min(stage.fitting_blocks for stage in stages)
    trace.add("admit", "7.6 step 6", "num_blocks", num_blocks,
              lambda: "min over stages of memory // bytes_per_block (or the override)")
    return Admission(length, fitted, required, num_blocks)


def longest_fitting(stage: StageSizing, blocks: Callable[[int], int], high: int) -> int:
    return longest_in(stage.bytes_per_block, stage.usable, blocks, high)


def _admit_stage(
    stage: StageSizing,
    needed_blocks: int,
    length: int,
    blocks: Callable[[int], int],
    longest_for_host: int | None,
) -> None:
    field = _memory_field(stage)
    where = "" if stage.layers is None else f" on pipeline stage {stage.index}"
    if stage.usable <= 0:
        raise CapacityError(
            f"{field}: no GPU memory left for KV cache blocks{where}: {stage.memory} bytes hold "
            f"no block beyond the null block of {stage.bytes_per_block} bytes",
            field=field,
        )
    needed = stage.bytes_per_block * needed_blocks
    if needed <= stage.usable:
        return
    high = length if longest_for_host is None else min(length, longest_for_host)
    fits = longest_fitting(stage, blocks, high)
    estimate = (
        f"the estimated max_model_len that fits is {fits}" if fits >= 1
        else "no max_model_len of 1 token or more fits"
    )
    raise CapacityError(
        f"{field}: one {length}-token request needs {needed_blocks} blocks of "
        f"{stage.bytes_per_block} bytes = {needed} bytes ({needed / GIB:.2f} GiB){where}, but "
        f"{stage.memory} bytes less the null block leave {stage.usable} ({stage.usable / GIB:.2f} "
        f"GiB); {estimate} (see docs/planning-rules.md#admission)",
        field=field,
    )


def _memory_field(stage: StageSizing) -> str:
    if stage.num_blocks_override is not None:
        return "device.num_blocks_override"
    if stage.layers is not None:
        return f"device.pipeline_stages[{stage.index}].available_bytes"
    return "device.available_bytes"
