"""The re-fit of vLLM 0.34's extensible KV cache (see docs/planning-rules.md#re-fit-after-warm-up).

With the extensible KV cache, vLLM plans a reservation, captures CUDA graphs and warms up, and
only then measures what memory is left. Every worker reports the blocks that memory holds; the
engine keeps the least (never more than planned), fits max_model_len again when it was
auto-fitted, checks that one request still fits beside the null block, and lowers num_blocks.
Here that is a pure function of the request, its plan and the measured bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hisparse_plan.checking import check_plan
from hisparse_plan.errors import CapacityError, PlanError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.operator.engines import make_plan


def refit_after_warmup(
    request: PlanRequest | Mapping[str, object],
    plan: KVCachePlan,
    measured_bytes: int | Sequence[int],
) -> KVCachePlan:
    """The plan vLLM uses once warm-up left `measured_bytes` of KV cache memory per pipeline
    stage (one figure for a one-stage plan).

    num_blocks becomes min(planned num_blocks, measured_s // bytes_per_block_s over stages).
    A request asked with auto-fit gets its length fitted again to that many blocks; without
    auto-fit a request that no longer fits is a CapacityError naming the figures. Groups, pages
    and bytes per block do not change; block-outermost layouts keep every offset and stride
    (vLLM only shrinks the committed prefix), layer-outer layouts are placed anew for the
    smaller pool.
    """
    request = request if isinstance(request, PlanRequest) else PlanRequest.model_validate(request)
    check_plan(plan, request=request)
    figures = [measured_bytes] if isinstance(measured_bytes, int) else list(measured_bytes)
    pools = plan.device_pools
    if len(figures) != len(pools):
        raise PlanError(
            f"measured_bytes: expected one figure per pipeline stage ({len(pools)}), got "
            f"{len(figures)}",
            field="measured_bytes",
        )
    measured_blocks = []
    for index, (pool, measured) in enumerate(zip(pools, figures, strict=True)):
        if isinstance(measured, bool) or not isinstance(measured, int) or measured < 0:
            raise PlanError(
                f"measured_bytes[{index}]: expected a byte count >= 0, got {measured!r}",
                field=f"measured_bytes[{index}]",
            )
        measured_blocks.append(measured // pool.bytes_per_block)
    num_blocks = min(plan.num_blocks, *measured_blocks)
    if num_blocks < 2:
        raise CapacityError(
            f"measured_bytes: after warm-up the KV cache holds {num_blocks} block(s) of "
            f"{pools[measured_blocks.index(min(measured_blocks))].bytes_per_block} bytes; "
            "expected at least the null block and one more",
            field="measured_bytes",
        )
    device = request.device.model_copy(update={"num_blocks_override": num_blocks})
    refitted = request.model_copy(update={"device": device})
    return make_plan(PlanRequest.model_validate(refitted.model_dump()))
