"""The all-GPU baseline: the same model on the same GPU memory without HiSparse, planned.

The baseline request is the HiSparse request with HiSparse switched off: the same layers (every
sparse latent and indexer cache becomes a regular `mla` layer on the GPU, beside any other
layers), the same memory and scheduler, no `index_topk` and no block-count override, and the
layout vLLM 0.34 resolves for those layers without HiSparse's connector (as on compute
capability 9.0; LBNHC for DeepSeek-V3.2 and GLM-5 on every CUDA GPU that serves them, see
docs/planning-rules.md#backends-and-layout): the HiSparse request's block-outermost layout is
no layout vLLM would give the baseline, and its kernels would misread it.
The planner plans it as it plans any regular request (see docs/planning-rules.md), so its groups,
bytes per block,
admission and capacity are the ones a vLLM engine without HiSparse would get. When that plan is
refused (one max_model_len request does not fit on the GPU without HiSparse), the baseline
holds no request and says why.
"""

from __future__ import annotations

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.base import ByteCount, Model, PositiveInt
from hisparse_plan.models.plan import Concurrency
from hisparse_plan.operator.engines import engine_layout, make_plan, required_blocks


class BaselineCapacity(Model):
    """How many max_model_len requests fit when the whole cache is on the GPU: HiSparse's
    baseline, or a regular model's own capacity."""

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


class RegularCapacity(BaselineCapacity):
    """A regular model's own capacity: its plan is already the all-GPU plan."""

    max_model_len: PositiveInt | None = None
    """The length the plan holds requests of (auto-fitted where asked); None when refused."""


def all_gpu_request(request: PlanRequest) -> PlanRequest:
    """`request` without HiSparse: its layers as regular layers, on the same GPU memory."""
    data = request.model_dump(mode="json")
    data["hisparse"] = None
    data["model"]["index_topk"] = None
    data["device"]["num_blocks_override"] = None
    regular = PlanRequest.model_validate(data)
    data["device"]["kv_cache_layout"] = engine_layout(regular).value
    return PlanRequest.model_validate(data)


def baseline_plan(request: PlanRequest) -> KVCachePlan:
    """The regular plan of `request` without HiSparse (PlanError when it is refused)."""
    return make_plan(all_gpu_request(request))


def baseline_capacity(request: PlanRequest) -> BaselineCapacity:
    """The baseline of `request`, from its real regular plan."""
    return _all_gpu_capacity(all_gpu_request(request))


def regular_capacity(request: PlanRequest) -> RegularCapacity:
    """A regular model's own capacity, from its plan: every cache already is on the GPU, so
    the request is planned as it is (its block-count override kept)."""
    if request.hisparse is not None:
        raise UnsupportedRequestError(
            "regular_capacity: expected a regular request (hisparse null), got a HiSparse one; "
            "compare it against its baseline with `compare`",
            field="hisparse",
        )
    try:
        plan = make_plan(request)
    except PlanError as error:
        return RegularCapacity.model_validate(_refused(error).model_dump())
    return RegularCapacity(**_planned(plan).model_dump(), max_model_len=plan.max_model_len)


def _all_gpu_capacity(request: PlanRequest) -> BaselineCapacity:
    try:
        return _planned(make_plan(request))
    except PlanError as error:
        return _refused(error)


def _refused(error: PlanError) -> BaselineCapacity:
    return BaselineCapacity(
        max_concurrency=0.0, bytes_per_block=None, num_blocks=None, blocks_per_request=None,
        refusal=" ".join(str(error).split()),
    )


def _planned(regular: KVCachePlan) -> BaselineCapacity:
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
