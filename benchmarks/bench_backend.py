"""Torch backend throughput against plain torch, in one run.

1. Host pool allocation + prefault (`allocate`, unpinned) against `torch.empty` + `fill_(0)`
   of the same number of bytes.
2. A shared host pool (`host_pool_name`, /dev/shm): creating it (map + prefault) and attaching
   it from a second allocation (map + prefault of pages that already exist).
3. `verify` of a DeepSeek-V3.2-shaped plan against `torch.clone` of the same pools.

    .venv/bin/python benchmarks/bench_backend.py [--host-gib 4] [--verify-gib 1] [--device cpu]
        [--max-model-len 4096] [--verify-only] [--threads-verify N]

The verify figure is compared with cloning the pools (page bytes / clone, target >= 0.25): the
clone pays for faulting in fresh memory as a new pool would; `copy_` into buffers already
faulted in is printed beside it for context.

Rates are in GiB/s for allocation and GB/s (10**9) for verify, as `VerifyReport` reports them.
Each figure is the median of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import hisparse_plan as hp
from hisparse_plan.torch import allocate, host_pool_bytes, verify

REQUEST = (Path(__file__).resolve().parent.parent
           / "src/hisparse_plan/data/deepseek_v32_fp8.request.json")
GIB = 2**30


def deepseek_plan(host_gib: float, device_gib: float, *, shared: bool = False,
                  max_model_len: int = 4096) -> hp.KVCachePlan:
    """DeepSeek-V3.2 (61 layers, fp8) with both pools cut down to the sizes asked for (a
    4096-token request needs about 0.45 GiB of device pool; 512 tokens about 0.25 GiB)."""
    request: dict[str, Any] = json.loads(REQUEST.read_text())
    request = copy.deepcopy(request)
    request["model"]["max_model_len"] = max_model_len
    request["hisparse"]["host_pool_gib"] = host_gib
    request["hisparse"]["shared_host_pool"] = shared
    request["device"]["available_bytes"] = int(device_gib * GIB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        return hp.plan(hp.PlanRequest.model_validate(request))


def timed(action: Callable[[], object], sync: torch.device | None = None) -> float:
    started = time.perf_counter()
    action()
    if sync is not None and sync.type == "cuda":
        torch.cuda.synchronize(sync)
    return time.perf_counter() - started


ALLOCATION_DEVICE_GIB = 0.5
"""The device pool beside the host pool timed: the smallest a 4096-token request fits in."""


def bench_allocation(host_gib: float, repeat: int, threads: int | None) -> tuple[float, float]:
    plan = deepseek_plan(host_gib, ALLOCATION_DEVICE_GIB)
    assert plan.host_pool is not None
    size = plan.host_pool.size
    ours, theirs = [], []
    for _ in range(repeat):
        # Only allocate() is timed, not the release: it is what an engine waits for.
        started = time.perf_counter()
        pools = allocate(plan, device="cpu", pin=False, prefault_threads=threads)
        ours.append(size / (time.perf_counter() - started) / GIB)
        pools.release()

        def plain() -> None:
            torch.empty(size, dtype=torch.uint8).fill_(0)

        theirs.append(size / timed(plain) / GIB)
    return statistics.median(ours), statistics.median(theirs)


def bench_shared(host_gib: float, repeat: int, threads: int | None) -> tuple[float, float]:
    """GiB/s of creating a shared host pool, and of attaching it from a second allocation."""
    plan = deepseek_plan(host_gib, ALLOCATION_DEVICE_GIB, shared=True)
    size = host_pool_bytes(plan)
    name = f"bench-{os.getpid()}"
    create, attach = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        first = allocate(plan, device="cpu", pin=False, prefault_threads=threads,
                         host_pool_name=name)
        create.append(size / (time.perf_counter() - started) / GIB)
        started = time.perf_counter()
        second = allocate(plan, device="cpu", pin=False, prefault_threads=threads,
                          host_pool_name=name)
        attach.append(size / (time.perf_counter() - started) / GIB)
        second.release()
        first.release()
    return statistics.median(create), statistics.median(attach)


def bench_verify(
    verify_gib: float, device: str, repeat: int, max_model_len: int = 4096
) -> dict[str, float]:
    plan = deepseek_plan(verify_gib / 2, verify_gib / 2, max_model_len=max_model_len)
    with allocate(plan, device=device, pin=False) as pools:
        host, pool = pools.host, pools.device
        assert host is not None
        pool_bytes = host.numel() + pool.numel()
        verify(plan, pools)  # warm: faults in the device pool, fills allocator caches
        reports = [verify(plan, pools) for _ in range(repeat)]

        def clone_both() -> None:
            host.clone()
            pool.clone()

        clone_seconds = statistics.median(timed(clone_both, pool.device) for _ in range(repeat))
        # For context: a copy into buffers whose pages are already there (clone pays for
        # faulting in fresh memory, which on some machines dominates).
        host_copy, pool_copy = torch.empty_like(host).fill_(0), torch.empty_like(pool).fill_(0)

        def copy_both() -> None:
            host_copy.copy_(host)
            pool_copy.copy_(pool)

        copy_seconds = statistics.median(timed(copy_both, pool.device) for _ in range(repeat))
    seconds = statistics.median(report.seconds for report in reports)
    page_bytes = reports[0].bytes
    return {
        "pool_bytes": pool_bytes,
        "page_bytes": page_bytes,
        "verify_seconds": seconds,
        "verify_page_gbps": page_bytes / seconds / 1e9,
        "verify_pool_gbps": pool_bytes / seconds / 1e9,
        "clone_gbps": pool_bytes / clone_seconds / 1e9,
        "copy_gbps": pool_bytes / copy_seconds / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-gib", type=float, default=4.0,
                        help="host pool size for the allocation figure")
    parser.add_argument("--verify-gib", type=float, default=1.0,
                        help="host + device pool size for the verify figure")
    parser.add_argument("--device", default="cpu", help="device pool: cpu or cuda[:N]")
    parser.add_argument("--threads", type=int, default=None, help="prefault threads")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=4096,
                        help="the verified plan's max_model_len (512 fits a 0.5 GiB pool pair)")
    parser.add_argument("--verify-only", action="store_true", help="skip the allocation figures")
    parser.add_argument("--threads-verify", type=int, default=None,
                        help="torch intra-op threads for the verify figure (and its clone)")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    if not args.verify_only:
        bench_host_pools(args)
    if args.threads_verify is not None:
        torch.set_num_threads(args.threads_verify)
    report_verify(bench_verify(args.verify_gib, args.device, args.repeat, args.max_model_len),
                  args.device)


def bench_host_pools(args: argparse.Namespace) -> None:
    ours, theirs = bench_allocation(args.host_gib, args.repeat, args.threads)
    print(f"host allocation + prefault, {args.host_gib:g} GiB:")
    print(f"  allocate(pin=False)          {ours:7.2f} GiB/s")
    print(f"  torch.empty + fill_(0)       {theirs:7.2f} GiB/s")
    print(f"  ratio                        {ours / theirs:7.2f}x")

    create, attach = bench_shared(args.host_gib, args.repeat, args.threads)
    print(f"shared host pool in /dev/shm, {args.host_gib:g} GiB:")
    print(f"  create (map + prefault)      {create:7.2f} GiB/s")
    print(f"  attach (map + prefault)      {attach:7.2f} GiB/s")


def report_verify(figures: dict[str, float], device: str) -> None:
    overlay = figures["page_bytes"] / figures["pool_bytes"]
    print(f"verify, DeepSeek-V3.2 layers, {figures['pool_bytes'] / GIB:.2f} GiB of pools "
          f"({figures['page_bytes'] / 1e9:.2f} GB of pages: groups overlay {overlay:.1f}x), "
          f"device pool on {device}, {torch.get_num_threads()} threads:")
    print(f"  verify, page bytes           {figures['verify_page_gbps']:7.2f} GB/s "
          f"({figures['verify_seconds']:.2f} s)")
    print(f"  verify, pool bytes           {figures['verify_pool_gbps']:7.2f} GB/s")
    clone = figures["clone_gbps"]
    print(f"  torch.clone of the pools     {clone:7.2f} GB/s")
    print(f"  copy_ into faulted buffers   {figures['copy_gbps']:7.2f} GB/s (context)")
    print(f"  ratio (page bytes / clone)   {figures['verify_page_gbps'] / clone:7.2f}"
          "  (target >= 0.25)")
    print(f"  ratio (pool bytes / clone)   {figures['verify_pool_gbps'] / clone:7.2f}")


if __name__ == "__main__":
    main()
