"""The backend's entry points for either engine's plan: `allocate`, `verify` and `meta_check` hand
a plan to its engine's part of the backend, `vllm/` for a `KVCachePlan` and `sglang/` for an
`SGLangPlan`. This is the one module of the backend outside those parts that names both: an
engine's part is added here, one line in each entry point, and its public names are offered to
the package's `__init__` from here.
"""

from __future__ import annotations

from functools import partial
from typing import Unpack, overload

import torch

from hisparse_plan.exchange.transfer import RankRegions
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.torch.allocation import AllocateOptions, Arguments
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.tasks import Progress
from hisparse_plan.torch.sglang.meta import SGLangMetaReport, meta_check_sglang
from hisparse_plan.torch.sglang.pools import SGLangPools, allocate_sglang
from hisparse_plan.torch.sglang.verify import verify_sglang
from hisparse_plan.torch.verifying import VerifyReport
from hisparse_plan.torch.vllm.binding import TORCH_DTYPES, bind_view, bind_views, check_bound
from hisparse_plan.torch.vllm.host import host_pool_bytes, host_trains
from hisparse_plan.torch.vllm.meta import MetaReport, meta_check_vllm
from hisparse_plan.torch.vllm.pools import Pools, allocate_vllm
from hisparse_plan.torch.vllm.verification import verify_vllm

__all__ = [
    "TORCH_DTYPES",
    "MetaReport",
    "Pools",
    "SGLangMetaReport",
    "SGLangPools",
    "allocate",
    "bind_view",
    "bind_views",
    "check_bound",
    "host_pool_bytes",
    "host_trains",
    "meta_check",
    "transfer_regions",
    "verify",
]
"""The entry points, each engine's pools and reports, and a vLLM plan's own binding (its views
bound by hand, its host trains), which the backend's public names (`hisparse_plan.torch`) have
offered since before the backend had one part per engine."""


@overload
def allocate(plan: KVCachePlan, **options: Unpack[AllocateOptions]) -> Pools: ...


@overload
def allocate(plan: SGLangPlan, **options: Unpack[AllocateOptions]) -> SGLangPools: ...


def allocate(plan: Plan, **options: Unpack[AllocateOptions]) -> Pools | SGLangPools:
    """Allocate the plan's pools: the host pool page-aligned and sized by `host_pool_bytes`,
    placed on a NUMA node, prefaulted on `prefault_threads` threads (default up to 8; 0 skips
    prefaulting) and, with `pin`, registered with CUDA in chunks of at most
    `register_chunk_bytes`; the device pool as one uint8 buffer on `device` ("cuda", "cuda:N",
    "cpu" or "meta").

    `stage`: a plan with pipeline stages has one device pool per stage, each for its own
    process; `stage=k` allocates only stage k's (`plan.device_pools[k].size` bytes), and the
    pools then bind and verify only stage k's layers. Required for such a plan; a one-stage
    plan takes None or 0.

    `host_pool_name`: for a plan whose `host_pool.shared` is true, the host pool lives in
    shared memory under that name (`hostmem/shm.py`): the first process creates it, the others
    attach it (same size required), each registers it with CUDA for itself, and the last to
    release it removes it. Its files are this user's alone (mode 0600, no symbolic links, the
    planned size); a name another user took is refused saying so, and the lock that orders
    the ranks is waited for at most `lock_timeout_s` seconds. `numa_node`: None places the
    host pool on the node of the GPU the device pool is on where the machine says which (a
    preference; where it cannot, a WARNING and the summary says why); a number binds it there
    or raises. `progress(step, done, total)` reports the "prefault" and "register" steps.

    Everything that can be refused is refused before memory is touched: a plan `check_plan`
    refuses (`UnsoundPlanError`, with check_plan's message; the proof costs the same for any
    num_blocks), an unknown device, CUDA or pinning where there is no CUDA, a host pool above
    95% of available RAM (a shared pool counts only in the process that creates it), a device
    pool above the GPU's free memory, a pool no chunking can register. A failure or interrupt
    midway (Ctrl-C included) frees whatever was already allocated, unregistering before
    unmapping. `registrar` replaces CUDA registration (for tests).

    Every keyword may be left out: device="cuda", pin=True, register_chunk_bytes=64 GiB,
    huge_pages=True (transparent huge pages asked for), lock_timeout_s=300, the others None
    (`Arguments` in `allocation.py` holds these defaults).

    A `KVCachePlan` gives `Pools` (`vllm/pools.py`); an `SGLangPlan`, with the same
    arguments and refusals, `SGLangPools` (`sglang/pools.py`): every pool as its `allocation`
    says, SGLang's buffers bound by `buffers()`.
    """
    arguments = Arguments(**options)
    if isinstance(plan, SGLangPlan):
        return allocate_sglang(plan, arguments)
    return allocate_vllm(plan, arguments)


def verify(
    plan: Plan,
    pools: Pools | SGLangPools,
    *,
    blocks: int | None = None,
    progress: Progress | None = None,
    chunk_bytes: int | None = None,
) -> VerifyReport:
    """Check every byte of every layer page of `plan` on `pools`, both ways
    (`vllm/verification.py`): for the pools of one pipeline stage, every page of that stage's
    layers.

    `blocks` limits each pool to a sample of about that many block ids spread from first to
    last, always including the first two and the last two; None checks every block.
    `progress("verify", done, total)` is called at the start and as each unit finishes: every
    pool's block-id pass, then every group. `chunk_bytes` is the page bytes handled per batch
    (default 4 MiB on the CPU, up to 256 MiB on a GPU, bounded by its free memory). Raises
    `VerifyError` at the first byte that disagrees, `BackendError` when a view cannot even be
    bound (outside its pool, misaligned) or the pools were released.

    An SGLang plan (with the `SGLangPools` allocate gave for it) is checked allocation by
    allocation (`sglang/verify.py`): every range of every layer's pages both ways, and each of
    SGLang's tensors on the bytes its plan view names, inside its pages. The report's `groups`
    then counts allocations and `pages` (layer, block, range) page ranges.
    """
    if blocks is not None and blocks < 1:
        raise BackendError(f"blocks is {blocks}; expected None (every block) or at least 1")
    if chunk_bytes is not None and chunk_bytes < 1:
        raise BackendError(f"chunk_bytes is {chunk_bytes}; expected at least 1")
    check: partial[VerifyReport]
    if isinstance(plan, SGLangPlan) or isinstance(pools, SGLangPools):
        if not (isinstance(plan, SGLangPlan) and isinstance(pools, SGLangPools)):
            raise BackendError(
                f"verify was given a {type(plan).__name__} with {type(pools).__name__}; "
                "expected the pools that allocate(plan) returned for that plan"
            )
        check = partial(verify_sglang, plan, pools)
    else:
        check = partial(verify_vllm, plan, pools)
    pools.check_shared("verifying it")
    try:
        return check(blocks=blocks, progress=progress, chunk_bytes=chunk_bytes)
    except torch.OutOfMemoryError as error:
        raise BackendError(
            f"verify ran out of device memory for its batch buffers ({error}); pass a smaller "
            "chunk_bytes"
        ) from error


@overload
def meta_check(plan: KVCachePlan, stage: int | None = None) -> MetaReport: ...


@overload
def meta_check(plan: SGLangPlan, stage: int | None = None) -> SGLangMetaReport: ...


def meta_check(plan: Plan, stage: int | None = None) -> MetaReport | SGLangMetaReport:
    """Bind every layer view of `plan` on meta pools of its full size and check each one
    against the plan's numbers; raise `BackendError` on the first that disagrees. A plan with
    pipeline stages: every stage, or only `stage` when given. An SGLang plan: every
    allocation on meta, SGLang's tensors bound and checked, every page range bound inside its
    allocation; nothing is touched (`SGLangMetaReport`)."""
    if isinstance(plan, SGLangPlan):
        return meta_check_sglang(plan, stage)
    return meta_check_vllm(plan, stage)


def transfer_regions(pools: Pools | SGLangPools, rank: RankRegions
                     ) -> dict[tuple[int, str], torch.Tensor]:
    """The tensor of each region a transfer program names for `rank`, from that rank's pools:
    a vLLM plan's regions are its device pool and its host pool, an SGLang plan's are its
    allocations (one per pool, or per layer of a per-layer pool)."""
    found: dict[tuple[int, str], torch.Tensor] = {}
    for region in rank.regions:
        if isinstance(pools, SGLangPools):
            tensor = pools.allocation(region.pool, region.layer)
        elif region.location == "device":
            tensor = pools.device
        elif pools.host is None:
            raise BackendError(f"region {region.name}: a host region, but the pools hold no "
                               "host pool; expected the plan the program was built from")
        else:
            tensor = pools.host
        found[(rank.rank, region.name)] = tensor
    return found
