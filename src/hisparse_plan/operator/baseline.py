"""The all-GPU baseline: the same model on the same GPU memory without HiSparse, planned.

The baseline request is the HiSparse request with HiSparse switched off: the same layers (every
sparse latent and indexer cache becomes a regular `mla` layer on the GPU, beside any other
layers), the same memory, layout and scheduler, no `index_topk` and no block-count override.
The planner plans it as it plans any regular request (see docs/planning-rules.md), so its groups,
bytes per block,
admission and capacity are the ones a vLLM engine without HiSparse would get. When that plan is
refused (one max_model_len request does not fit on the GPU without HiSparse), the baseline
holds no request and says why.
"""

from __future__ import annotations

from hisparse_plan.errors import PlanError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.base import ByteCount, Model, PositiveInt
from hisparse_plan.models.plan import Concurrency
from hisparse_plan.targets.vllm import plan as make_plan
from hisparse_plan.targets.vllm.rules.required import required_blocks


class BaselineCapacity(Model):
    """How many max_model_len requests fit when the whole cache is on the GPU."""

    max_concurrency: Concurrency
    """The regular plan's max_concurrency; 0 when the planner refuses it."""
    bytes_per_block: PositiveInt | None
    """The regular plan's device bytes per block (the largest stage's); None when refused."""
    num_blocks: ByteCount | None
    """The regular plan's num_blocks; None when refused."""
    blocks_per_request: PositiveInt | None
    """Blocks one max_model_len request holds, summed over the regular plan's groups."""
    refusal: str | None = None
    """Why the planner refused the all-GPU plan, when it did."""


def all_gpu_request(request: PlanRequest) -> PlanRequest:
    """`request` without HiSparse: its layers as regular layers, on the same GPU memory."""
    data = request.model_dump(mode="json")
    data["hisparse"] = None
    data["model"]["index_topk"] = None
    data["device"]["num_blocks_override"] = None
    return PlanRequest.model_validate(data)


def baseline_plan(request: PlanRequest) -> KVCachePlan:
    """The regular plan of `request` without HiSparse (PlanError when it is refused)."""
    return make_plan(all_gpu_request(request))


def baseline_capacity(request: PlanRequest) -> BaselineCapacity:
    """The baseline of `request`, from its real regular plan."""
    try:
        regular = baseline_plan(request)
    except PlanError as error:
        return BaselineCapacity(
            max_concurrency=0.0, bytes_per_block=None, num_blocks=None, blocks_per_request=None,
            refusal=" ".join(str(error).split()),
        )
    per_request = sum(
        required_blocks(group.spec, regular.max_model_len, regular.workload)
        for group in regular.groups
    )
    return BaselineCapacity(
        max_concurrency=regular.capacity.max_concurrency,
        bytes_per_block=max(pool.bytes_per_block for pool in regular.device_pools),
        num_blocks=regular.num_blocks,
        blocks_per_request=per_request,
    )
