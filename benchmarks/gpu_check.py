"""The torch backend's CUDA paths on a real GPU: one short script, well under 5 minutes.

    python benchmarks/gpu_check.py [--host-gib 8] [--device-gib 8] [--device cuda:0]

Without CUDA it only answers --help or --device cpu (exit 2 otherwise); importing it needs
torch, not a GPU.

Prints one line per check and exits 1 at the first failure (2 without CUDA); with
--keep-going every section runs and the failed ones are counted at the end:

1. allocate(pin=True) with 1 GiB registration chunks: several chunks, every edge OS-page
   aligned and inside no page, the pool reports is_pinned(), and registering any chunk again
   fails as already registered.
2. Pinned copies: a layer's pages, across chunk edges, to the device pool and back, intact; the
   pinned host-to-device rate next to a pageable one.
3. verify, every block and a sample, with the device groups on the GPU.
4. release(): every chunk unregistered (a view kept past it reports is_pinned() False).
5. Rollback on real CUDA: with one chunk registered beforehand, register_chunks fails on it and
   leaves none of the others registered, sequentially and threaded.
6. Refusals: a device pool above free memory; a registration chunk of 512 GiB.
7. Timing: allocate + prefault + pin against torch.empty(pin_memory=True) of the same bytes
   (with torch's host allocator stats, which show its power-of-two rounding).
8. The DeepSeek-V3.2 golden plan on the meta device.
9. NUMA: the pinned pool on the GPU's node as sysfs gives it (MPOL_PREFERRED, every sampled
   page there), or unbound with the reason where sysfs does not know; numa_node=0 binds
   (MPOL_BIND) and still pins.
10. Ctrl-C in the middle of real registration (a registrar that raises KeyboardInterrupt right
   after cudaHostRegister of chunk k returned, sequential and threaded): nothing stays pinned.
11. A shared host pool (host_pool_name) across two processes, each pinning its own mapping:
   writes through one process's pinned mapping from the GPU are read by the other's, both
   ways; nothing is left in /dev/shm after both release.
12. Regular plans on the GPU: the Qwen3-Next golden plan (Mamba pages padded to the attention
   page) and one stage of the Llama-3-70B four-stage golden plan, each with --device-gib per
   pool, allocated and verified (a sample of blocks); a layer of another stage is refused.
13. SGLang plans on the GPU: DeepSeek-V3.2-like DSA layers with HiSparse (per-layer latent and
   index buffers on the GPU, the pinned host pool in chunks) and Llama-like MHA layers (K/V
   halves of one buffer): allocated, SGLang's buffers bound on the GPU, every page verified,
   a host page copied to the GPU and back, released with nothing left pinned.
14. An SGLang hybrid plan with Mamba pools on the GPU: Qwen3-Next's layer pattern (three Gated
   DeltaNet layers to one full-attention layer) cut to eight layers in 1 GiB, allocated with
   pin=True: every allocation and buffer on the GPU, the conv and temporal state tensors bound
   with the plan's shapes, strides and dtypes, a slot written through SGLang's tensor read back
   through it and as the plan's bytes of that slot (its neighbours untouched), every page and
   slot verified.
15. A transfer from a prefill to a HiSparse decode: DeepSeek-V3.2 (vLLM, BLNHC) without
   HiSparse on the GPU, one 3,000-token request in one-block runs moved with the torch
   executor (hisparse_plan.torch.transfer) into a HiSparse decode's device pool (index keys)
   and pinned host pool (latent rows), both allocated with allocate(pin=True); the program
   built and proved first; every token of every layer read back through the decode's views
   against the prefill's; no byte outside the program's rows changed; every row inside the
   request's pages as the decode's views place them (hot and resident pages are in others);
   then the same request through the proved pattern (compile_transfer, check_pattern,
   instantiate) with the batched torch executor (execute_request): the same bytes.
   `transfer-placement`: the same into a decode whose host pool is block-outermost
   (hisparse.host_pool_layout, docs/transfer.md#placement-that-transfers-well).
16. Staged transfers (gpu_check_staged.py): DeepSeek-V3.2 BLNHC prefill on the GPU into a
   HiSparse decode (device pool + pinned host pool) and Llama-3-70B TP 2 -> TP 1, 16,384
   tokens in runs of 16 blocks, staged and direct with the torch executor, each against one
   copy of the same bytes; the two results compared byte for byte.

--device cpu runs only the sections that need no GPU (15 and 16 without pinning, and the
meta check): a dry run of their code. --only NAME,... runs the named sections.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

import hisparse_plan as hp
from gpu_check_staged import staged_transfers
from hisparse_plan.presets.settings import HostPoolLayout
from hisparse_plan.torch import (
    BackendError,
    CudaRegistrar,
    RegistrationError,
    SGLangPools,
    allocate,
    host_pool_bytes,
    host_trains,
    meta_check,
    transfer_regions,
    verify,
)
from hisparse_plan.torch.hostmem.chunks import MAX_REGISTRATION_BYTES, Chunk, lowest_crossing
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer
from hisparse_plan.torch.hostmem.numa import memory_policy, page_node, pci_bus_id, pci_numa_node
from hisparse_plan.torch.hostmem.registration import register_chunks
from hisparse_plan.torch.hostmem.shm import lock_path, pool_path
from hisparse_plan.torch.sglang.binding import BUFFER_TORCH_DTYPES
from hisparse_plan.views import plan_views

DATA = Path(__file__).resolve().parent.parent / "src/hisparse_plan/data"
GOLDEN = Path(__file__).resolve().parent.parent / "tests/golden"
GIB = 2**30
CPU_SECTIONS = frozenset({"transfer", "transfer-placement", "staged transfer", "meta"})
"""The sections that also run with --device cpu (a dry run without pinning)."""
ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered


class CheckFailed(Exception):
    pass


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        raise CheckFailed(name)


def deepseek(host_gib: float, device_bytes: int, *, shared: bool = False) -> hp.KVCachePlan:
    request: dict[str, Any] = copy.deepcopy(
        json.loads((DATA / "deepseek_v32_fp8.request.json").read_text()))
    request["model"]["max_model_len"] = 4096
    request["hisparse"]["host_pool_gib"] = host_gib
    request["hisparse"]["shared_host_pool"] = shared
    request["device"]["available_bytes"] = device_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        return hp.plan(hp.PlanRequest.model_validate(request))


def seconds(action: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    action()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def pinned_pools(plan: hp.KVCachePlan, device: str) -> None:
    assert plan.host_pool is not None
    size = plan.host_pool.size
    started = time.perf_counter()
    pools = allocate(plan, device=device, pin=True, register_chunk_bytes=GIB)
    took = time.perf_counter() - started
    host = pools.host
    assert host is not None
    chunks = pools.chunks
    print(f"     allocate(pin=True): {size / GIB:.2f} GiB host pool in {len(chunks)} chunks, "
          f"{took:.2f} s ({size / GIB / took:.2f} GiB/s with prefault and pinning)")
    check("several chunks cover the pool",
          len(chunks) > 1 and chunks[0].start == 0 and chunks[-1].end == size
          and all(a.end == b.start for a, b in itertools.pairwise(chunks)))
    trains = host_trains(plan)
    check("chunk edges are OS-page aligned and inside no page",
          all(c.end % OS_PAGE == 0 and all(lowest_crossing(t, c.end) is None for t in trains)
              for c in chunks[:-1]))
    check("the host pool is pinned", bool(host.is_pinned()))
    registrar = CudaRegistrar(pools.device.device.index or 0)
    codes = [registrar.register(host.data_ptr() + c.start, c.nbytes) for c in chunks]
    check("each chunk is registered already", all(code == ALREADY_REGISTERED for code in codes),
          f"cudaHostRegister again returned {sorted(set(codes))}")

    kept = host[: chunks[0].nbytes]
    try:
        copies(plan, pools.views(), chunks, pools.device.device)
        report = verify(plan, pools)
        check("verify, every block", not report.sampled,
              f"{report.pages} pages, {report.bytes / 1e9:.2f} GB in {report.seconds:.2f} s "
              f"({report.gb_per_s:.2f} GB/s)")
        sampled = verify(plan, pools, blocks=64)
        check("verify, 64 blocks a pool", sampled.sampled, f"{sampled.seconds:.2f} s")
    finally:
        pools.release()
    check("release unpins every chunk", not kept.is_pinned() and pools.chunks == ())
    retry = [registrar.register(kept.data_ptr() + c.start, c.nbytes) for c in chunks[:1]]
    check("a released chunk can be registered afresh", retry == [0])
    registrar.unregister(kept.data_ptr())


def copies(
    plan: hp.KVCachePlan, views: dict[str, torch.Tensor], chunks: tuple[Chunk, ...],
    device: torch.device,
) -> None:
    """A host layer's pages to the GPU and back, a copy per page: CUDA refuses one transfer
    that spans two registrations (cudaErrorInvalidValue, seen on an H200), and a page never
    crosses a chunk edge, so page copies are what an engine can issue."""
    name = "model.layers.30.self_attn.attn"  # a host layer whose slab crosses chunk edges
    layer = plan_views(plan)[name]
    source = views[name]
    span = (layer.offset, layer.offset + layer.num_blocks * layer.block_stride)
    crossed = sum(span[0] < c.end < span[1] for c in chunks)
    raw = source.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    staging = torch.empty(source.shape, dtype=source.dtype, device=device)
    back = torch.empty_like(source, device="cpu").pin_memory()
    blocks = range(layer.num_blocks)
    nbytes = layer.num_blocks * layer.block_stride

    def up(host: torch.Tensor) -> None:
        for block in blocks:
            staging[block].copy_(host[block], non_blocking=True)

    pinned_s = seconds(lambda: up(source))
    seconds(lambda: back.copy_(staging, non_blocking=True))
    check("a layer's pages go to the GPU and back intact, a copy per page",
          torch.equal(back.view(torch.uint8), raw),
          f"{nbytes / GIB:.2f} GiB in {layer.num_blocks} pages across {crossed} chunk edges")
    pageable = source.clone()
    pageable_s = seconds(lambda: up(pageable))
    print(f"     host -> device, a copy per {layer.block_stride} B page: pinned "
          f"{nbytes / pinned_s / 1e9:.1f} GB/s, pageable {nbytes / pageable_s / 1e9:.1f} GB/s")


def registered(registrar: CudaRegistrar, address: int, nbytes: int) -> bool:
    """Whether exactly this range is registered now. Not `Tensor.is_pinned()`: torch asks
    about the start of the tensor's storage, so every slice of a buffer answers for its first
    chunk."""
    code = registrar.register(address, nbytes)
    if code == 0:
        registrar.unregister(address)
        return False
    if code == ALREADY_REGISTERED:
        return True
    raise CheckFailed(f"cudaHostRegister probe returned {code}")


def rollback(device_index: int) -> None:
    chunk_bytes = 64 * 2**20
    for threads in (1, 4):
        buffer = HostBuffer(6 * chunk_bytes)
        buffer.prefault(4)
        pieces = [Chunk(i, i * chunk_bytes, (i + 1) * chunk_bytes) for i in range(6)]
        registrar = CudaRegistrar(device_index)
        blocker = buffer.address + 3 * chunk_bytes
        check(f"pre-register chunk 3 (threads={threads})",
              registrar.register(blocker, chunk_bytes) == 0)
        try:
            register_chunks(buffer.address, pieces, registrar, threads=threads)
        except RegistrationError as error:
            failed = error.chunk
        else:
            failed = None
        try:
            others = [registered(registrar, buffer.address + c.start, c.nbytes)
                      for c in pieces if c.index != 3]
            check(f"rollback leaves nothing registered (threads={threads})",
                  failed == 3 and not any(others), f"failed chunk {failed}, registered {others}")
            check("the pre-registered chunk is untouched",
                  registered(registrar, blocker, chunk_bytes))
            probe = torch.empty(1, device=torch.device("cuda", device_index))
            check("no CUDA error is left behind for the next call", probe.numel() == 1)
        finally:
            registrar.unregister(blocker)
            buffer.release()


def numa_placement(plan: hp.KVCachePlan, device: str) -> None:
    index = torch.device(device).index or 0
    bus = pci_bus_id(index)
    node, why = (None, "torch reports no PCI bus id") if bus is None else pci_numa_node(bus)
    print(f"     {device}: PCI {bus}, sysfs NUMA node {node} ({why})")
    with allocate(plan, device=device, pin=True) as pools:
        host = pools.host
        assert host is not None
        assert pools.numa is not None
        print("     " + pools.summary().replace("\n", "\n     "))
        if node is None:
            check("NUMA: unbound where sysfs does not know, with the reason",
                  pools.numa.node is None and bool(pools.numa.reason), pools.numa.describe())
        else:
            step = max(OS_PAGE, host.numel() // 64 // OS_PAGE * OS_PAGE)
            nodes = {page_node(host.data_ptr() + at) for at in range(0, host.numel(), step)}
            check(f"NUMA: the pinned pool prefers node {node} and its pages are there",
                  pools.numa.node == node and memory_policy(host.data_ptr()) ==
                  ("MPOL_PREFERRED", [node]) and nodes == {node},
                  f"{pools.numa.describe()}; sampled pages on nodes {sorted(map(str, nodes))}")
        check("NUMA: the placed pool is pinned", bool(host.is_pinned()))
    with allocate(plan, device=device, pin=True, numa_node=0) as pools:
        host = pools.host
        assert host is not None
        assert pools.numa is not None
        check("NUMA: numa_node=0 binds (MPOL_BIND) and pins",
              memory_policy(host.data_ptr()) == ("MPOL_BIND", [0])
              and page_node(host.data_ptr() + host.numel() - 1) == 0
              and bool(host.is_pinned()), pools.numa.describe())


class InterruptingRegistrar(CudaRegistrar):
    """Real registration, with KeyboardInterrupt right after the call for chunk `at` returned
    (the worst moment: registered, not yet recorded)."""

    def __init__(self, device_index: int, base: int, chunk_bytes: int, at: int) -> None:
        super().__init__(device_index)
        self.target = base + at * chunk_bytes

    def register(self, address: int, nbytes: int) -> int:
        code = super().register(address, nbytes)
        if address == self.target:
            raise KeyboardInterrupt
        return code


def interrupted_registration(device_index: int) -> None:
    chunk_bytes = 64 * 2**20
    for threads, at in itertools.product((1, 4), (0, 3, 5)):
        buffer = HostBuffer(6 * chunk_bytes)
        buffer.prefault(4)
        pieces = [Chunk(i, i * chunk_bytes, (i + 1) * chunk_bytes) for i in range(6)]
        registrar = InterruptingRegistrar(device_index, buffer.address, chunk_bytes, at)
        try:
            register_chunks(buffer.address, pieces, registrar, threads=threads)
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
        probe = CudaRegistrar(device_index)
        pinned = [registered(probe, buffer.address + c.start, c.nbytes) for c in pieces]
        check(f"Ctrl-C after chunk {at} registered (threads={threads}) leaves nothing pinned",
              interrupted and not any(pinned), f"registered {pinned}")
        buffer.release()


def shared_rank(connection: Connection, plan_json: str, name: str, device: str) -> None:
    """The second process: attach the shared pool, pin it, and copy through it."""
    plan = hp.KVCachePlan.model_validate_json(plan_json)
    with allocate(plan, device=device, pin=True, host_pool_name=name) as pools:
        host = pools.host
        assert host is not None
        assert pools.shared is not None
        connection.send((pools.shared.created, bool(host.is_pinned()), pools.numa and
                         pools.numa.describe()))
        seed = connection.recv()
        # GPU -> this process's pinned mapping.
        host.copy_(pattern(seed, host.numel(), torch.device(device)), non_blocking=True)
        torch.cuda.synchronize()
        connection.send("written")
        seed = connection.recv()
        # The other process's writes, read back through this mapping onto the GPU.
        on_gpu = host.to(device, non_blocking=True)
        connection.send(bool(torch.equal(on_gpu, pattern(seed, host.numel(),
                                                         torch.device(device)))))
        connection.recv()
    connection.send("closed")


def pattern(seed: int, nbytes: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device,
                         generator=generator)


def receive(connection: Connection) -> Any:  # noqa: ANN401 - whatever the other process sent
    """The other process's next answer; a failed check if it died or hangs."""
    if not connection.poll(120):
        check("shared pool: the other process answers", False, "no answer within 120 s")
    return connection.recv()


def shared_pool(host_gib: float, device: str) -> None:
    plan = deepseek(host_gib, GIB, shared=True)
    name = f"gpu-check-{os.getpid()}"
    spawn = multiprocessing.get_context("spawn")
    with allocate(plan, device=device, pin=True, host_pool_name=name) as pools:
        host = pools.host
        assert host is not None
        assert pools.shared is not None
        check("shared pool: created and pinned here", pools.shared.created
              and bool(host.is_pinned()) and host.numel() == host_pool_bytes(plan),
              pools.summary().replace("\n", "; "))
        connection, child = spawn.Pipe()
        # A daemon: should a check fail here, exiting does not wait on it.
        other = spawn.Process(target=shared_rank,
                              args=(child, plan.model_dump_json(), name, device), daemon=True)
        other.start()
        created, pinned, placement = receive(connection)
        check("shared pool: the other process attached and pinned its own mapping",
              not created and pinned, str(placement))
        connection.send(21)
        receive(connection)
        gpu = torch.device(device)
        check("shared pool: its GPU writes are read here, through this pinned mapping",
              torch.equal(host.to(device), pattern(21, host.numel(), gpu)))
        host.copy_(pattern(22, host.numel(), gpu))
        torch.cuda.synchronize()
        connection.send(22)
        check("shared pool: this process's writes are read there", receive(connection) is True)
        connection.send("close")
        receive(connection)
        other.join(60)
        check("shared pool: kept while this process holds it", pool_path(name).exists())
    left = [str(path) for path in (pool_path(name), lock_path(name)) if path.exists()]
    check("shared pool: nothing left in /dev/shm after both release", not left, str(left))


def refusals(device: str) -> None:
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    plan = deepseek(0.5, free + 64 * GIB)
    try:
        allocate(plan, device=device, pin=False)
    except BackendError as error:
        check("a device pool above free memory is refused", "free of" in str(error), str(error))
    else:
        check("a device pool above free memory is refused", False)
    try:
        allocate(deepseek(0.5, GIB), device=device, register_chunk_bytes=MAX_REGISTRATION_BYTES)
    except BackendError as error:
        check("a 512 GiB registration chunk is refused", "512.00 GiB" in str(error))
    else:
        check("a 512 GiB registration chunk is refused", False)


def versus_torch_pinned(size: int, device: str) -> None:
    plan = deepseek(size / GIB, GIB)
    assert plan.host_pool is not None
    nbytes = plan.host_pool.size
    started = time.perf_counter()
    allocate(plan, device=device).release()
    ours = time.perf_counter() - started
    started = time.perf_counter()
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(0)
    theirs = time.perf_counter() - started
    stats: dict[str, Any] = {}
    host_stats = getattr(torch.cuda, "host_memory_stats", None)
    if callable(host_stats):
        stats = {k: v for k, v in host_stats().items() if "reserved" in k or "allocated" in k}
    del pinned
    print(f"     {nbytes / GIB:.2f} GiB pinned: allocate {nbytes / GIB / ours:.2f} GiB/s, "
          f"torch.empty(pin_memory=True)+fill_ {nbytes / GIB / theirs:.2f} GiB/s; torch host "
          f"allocator stats {stats}")


def golden_request(case: str, device_bytes: int) -> dict[str, Any]:
    """A golden request with every device pool given `device_bytes`."""
    request: dict[str, Any] = json.loads((GOLDEN / f"{case}.request.json").read_text())
    stages = request["device"].get("pipeline_stages")
    for pool in stages if stages else [request["device"]]:
        pool["available_bytes"] = device_bytes
    return request


def regular_plans(device_bytes: int, device: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        qwen = hp.plan(hp.PlanRequest.model_validate(
            golden_request("regular_qwen3_next_80b_mamba", device_bytes)))
        llama = hp.plan(hp.PlanRequest.model_validate(
            golden_request("regular_llama3_70b_pp4_autofit", device_bytes)))
    with allocate(qwen, device=device, pin=False) as pools:
        report = verify(qwen, pools, blocks=64)
    check("Qwen3-Next (padded Mamba pages) verified on the GPU", report.layers == 48,
          f"{qwen.device_pool.size / GIB:.2f} GiB, {report.pages} pages, "
          f"{report.gb_per_s:.1f} GB/s")
    with allocate(llama, device=device, pin=False, stage=1) as pools:
        report = verify(llama, pools, blocks=64)
        check("Llama-3-70B pipeline stage 1 verified on the GPU", report.layers == 20,
              f"{llama.device_pools[1].size / GIB:.2f} GiB, {report.pages} pages")
        try:
            pools.view("model.layers.0.self_attn.attn")
        except BackendError as error:
            check("a layer of stage 0 is refused by stage 1's pools", "stage 0" in str(error))
        else:
            check("a layer of stage 0 is refused by stage 1's pools", False)


def sglang_request(layers: dict[str, Any], budget: int, **engine: Any) -> hp.PlanRequest:  # noqa: ANN401
    engine.setdefault("context_length", 4096)
    return hp.PlanRequest.model_validate({
        "layers": layers, "model": {"max_model_len": engine["context_length"]},
        "device": {"available_bytes": budget}, "engine": {"name": "sglang", **engine},
    })


def sglang_plans(device: str) -> None:
    latent = {"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "uint8",
              "cache_dtype": "fp8_ds_mla", "state_content_bytes": 656}
    indexer = {"kind": "mla", "block_size": 64, "head_size": 132, "dtype": "uint8",
               "cache_role": "indexer"}
    dsa = {}
    for i in range(4):
        dsa[f"model.layers.{i}.self_attn.attn"] = latent
        dsa[f"model.layers.{i}.self_attn.indexer.k_cache"] = indexer
    mha = {f"model.layers.{i}.self_attn.attn": {
        "kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128,
        "dtype": "bfloat16"} for i in range(4)}
    cases = {
        "DSA + HiSparse": sglang_request(dsa, GIB, enable_hisparse=True),
        "MHA": sglang_request(mha, GIB, page_size=16),
    }
    for name, request in cases.items():
        plan = hp.plan_for_engine(request)
        assert isinstance(plan, hp.SGLangPlan)
        with allocate(plan, device=device, pin=True, register_chunk_bytes=GIB // 4) as pools:
            buffers = pools.buffers()
            on_gpu = [t for (pool, _, _), t in buffers.items()
                      if any(p.name == pool and p.location == "device" for p in plan.pools)]
            check(f"SGLang {name}: device buffers bound on the GPU",
                  bool(on_gpu) and all(t.device.type == "cuda" for t in on_gpu),
                  f"{len(buffers)} buffers, {pools.summary()}")
            if plan.hisparse is not None:
                host = next(t for (pool, _, _), t in buffers.items() if pool == "hisparse_host")
                check(f"SGLang {name}: the host pool is pinned", bool(host.is_pinned()),
                      f"{len(pools.chunks)} chunks")
                page = host[0, 64:128].contiguous() if host.dim() > 2 else host[64:128]
                page.view(torch.uint8).copy_(torch.randint(0, 256, page.view(torch.uint8).shape,
                                                           dtype=torch.uint8))
                back = page.to(device).cpu()
                check(f"SGLang {name}: a host page goes to the GPU and back", torch.equal(
                    back.view(torch.uint8), page.view(torch.uint8)))
            report = verify(plan, pools)
            check(f"SGLang {name}: verify, every page", not report.sampled,
                  f"{report.pages} page ranges, {report.bytes / 1e6:.1f} MB in "
                  f"{report.seconds:.2f} s")
            chunks = pools.chunks
            kept = None if plan.hisparse is None else next(
                t for (pool, _, _), t in buffers.items() if pool == "hisparse_host")
        registrar = CudaRegistrar(torch.device(device).index or 0)
        if kept is not None:
            left = [registered(registrar, kept.data_ptr() + c.start, c.nbytes) for c in chunks]
            check(f"SGLang {name}: nothing left registered after release", not any(left),
                  f"registered {left}")


MAMBA_POOLS = ("mamba_conv0", "mamba_temporal")
"""SGLang's MambaPool: the conv state and the recurrent (temporal) state, one pool each."""


def qwen3_next_like(budget: int) -> hp.SGLangPlan:
    """Qwen3-Next-80B's per-rank layers cut to eight: its 3:1 pattern of Gated DeltaNet and full
    attention and its real state shapes, so the state slots are as large as the GPU will see
    (2 MiB of float32 temporal state a layer) while the whole plan stays small."""
    attention = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 2,
                 "head_size": 256, "dtype": "bfloat16"}
    # No mamba_ssm_dtype: SGLang's float32 temporal state next to the bfloat16 conv state, so
    # the two bound tensors differ in dtype as they do in a served Qwen3-Next.
    linear = {"kind": "mamba", "block_size": 4096, "state_shapes": [[3, 8192], [32, 128, 128]],
              "state_dtypes": ["bfloat16", "bfloat16"]}
    layers = {
        f"model.layers.{i}.self_attn.attn" if i % 4 == 3 else f"model.layers.{i}.linear_attn":
        attention if i % 4 == 3 else linear for i in range(8)
    }
    plan = hp.plan_for_engine(sglang_request(layers, budget))
    assert isinstance(plan, hp.SGLangPlan)
    return plan


def mamba_slot(pools: SGLangPools, pool: str, layers: list[str], state: torch.Tensor) -> None:
    """The last slot of the last Mamba layer, written through SGLang's state tensor on the GPU,
    must read back through it and as the plan's bytes of that slot (`pages`, bound from the
    plan's offsets, not from the view), while the slot before it and the same slot of the first
    layer keep their bytes: the view addresses exactly the slot the plan says."""
    layer = len(layers) - 1
    slot = state.shape[1] - 1
    neighbours = (state[layer, slot - 1], state[0, slot])
    untouched = [raw_bytes(neighbour).clone() for neighbour in neighbours]
    values = torch.randn(state.shape[2:], dtype=state.dtype, device=state.device)
    state[layer, slot].copy_(values)
    page = pools.pages(layers[layer])[(pool, 0)][slot]
    written = raw_bytes(values)
    check(f"SGLang Mamba: {pool} slot {slot} of {layers[layer]} reads back as written",
          torch.equal(raw_bytes(state[layer, slot]), written) and torch.equal(page, written),
          f"{page.numel()} bytes")
    check(f"SGLang Mamba: {pool} slot {slot - 1} and layer 0's slot {slot} are untouched",
          all(torch.equal(raw_bytes(neighbour), before)
              for neighbour, before in zip(neighbours, untouched, strict=True)))


def raw_bytes(state: torch.Tensor) -> torch.Tensor:
    """A slot's bytes. Slots are compared as bytes, not floats: memory reused from an earlier
    section holds verify's patterns, NaNs among them, and NaN never equals itself."""
    return state.reshape(-1).view(torch.uint8)


def sglang_mamba(device: str) -> None:
    plan = qwen3_next_like(GIB)
    states = {tensor.pool: tensor for tensor in plan.tensors if tensor.pool in MAMBA_POOLS}
    check("SGLang Mamba: the plan has the conv and temporal state pools",
          sorted(states) == sorted(MAMBA_POOLS), ", ".join(pool.name for pool in plan.pools))
    layers = {layer for tensor in plan.tensors for layer in tensor.layers}
    with allocate(plan, device=device, pin=True) as pools:
        held = pools.allocations()
        buffers = pools.buffers()
        on_device = {pool.name for pool in plan.pools if pool.location == "device"}
        check("SGLang Mamba: every device allocation and buffer on the GPU",
              {pool for pool, _ in held} == on_device
              and all(t.device.type == "cuda" for t in [*held.values(), *buffers.values()]),
              pools.summary().replace("\n", "; "))
        for pool, tensor in states.items():
            (view,) = tensor.views  # SGLang has one state tensor per Mamba pool
            state = buffers[(pool, None, view.name)]
            check(f"SGLang Mamba: {pool} bound as {view.name}, {view.dtype} {view.shape}",
                  state.dtype == BUFFER_TORCH_DTYPES[view.dtype]
                  and list(state.shape) == view.shape and list(state.stride()) == view.strides,
                  f"got {state.dtype} {list(state.shape)} strides {list(state.stride())}")
            mamba_slot(pools, pool, tensor.layers, state)
        report = verify(plan, pools)
        check("SGLang Mamba: verify, every page and slot of every layer",
              not report.sampled and report.layers == len(layers),
              f"{report.layers} layers, {report.pages} page ranges, "
              f"{report.bytes / 1e6:.1f} MB in {report.seconds:.2f} s")


# ---- 15. a transfer from a prefill plan on the GPU to a HiSparse decode plan ---------------
def transfer_plans(device_bytes: int, host_bytes: int, tokens: int,
                   host_layout: HostPoolLayout | None = None
                   ) -> tuple[hp.KVCachePlan, hp.KVCachePlan]:
    """DeepSeek-V3.2 in vLLM's BLNHC: a prefill without HiSparse and a HiSparse decode (index
    keys in the device pool, latent rows in the pinned host pool, laid out as `host_layout`
    asks: hisparse.host_pool_layout), both admitting `tokens`."""
    from hisparse_plan.models import KVCacheLayout
    from hisparse_plan.presets import Settings, build_request, load_preset

    plans = []
    for hisparse in (False, True):
        settings = Settings(layout=KVCacheLayout.BLNHC, gpu_mem_bytes=device_bytes,
                            hisparse=hisparse, host_pool_bytes=host_bytes if hisparse else None,
                            max_model_len=tokens,
                            host_pool_layout=host_layout if hisparse else None)
        plan = hp.plan(build_request(load_preset("deepseek-v3.2").architecture, settings))
        if not isinstance(plan, hp.KVCachePlan):
            raise CheckFailed("transfer: the DeepSeek-V3.2 preset did not give a vLLM plan")
        plans.append(plan)
    return plans[0], plans[1]


def request_blocks(plan: hp.KVCachePlan, tokens: int) -> dict[str, list[int]]:
    """Every other block from each table's far end: a request in one-block runs."""
    from hisparse_plan.exchange.transfer import tables

    found: dict[str, list[int]] = {}
    taken = 0
    for key, table in tables(plan).items():
        count = -(-tokens // table.block_tokens)
        found[key] = [table.num_blocks - 1 - taken - 2 * i for i in range(count)]
        taken += 2 * count
    return found


def request_tokens(view: torch.Tensor, blocks: list[int], tokens: int) -> torch.Tensor:
    """The request's first `tokens` rows of a layer, read through the layer's view (blocks
    first, then the block's tokens): one row of bytes per token."""
    pages = view[torch.tensor(blocks, device=view.device)]
    return pages.reshape(len(blocks) * math.prod(view.shape[1:-1]), -1)[:tokens]


def byte_mask(region: torch.Tensor, places: list[tuple[int, list[int], list[int]]]
              ) -> torch.Tensor:
    """A bool per byte of `region`, true where any (offset, shape, strides) place lies."""
    mask = torch.zeros(region.numel(), dtype=torch.bool, device=region.device)
    for offset, shape, strides in places:
        mask.as_strided(shape, strides, offset).fill_(True)
    return mask


def transfer_to_hisparse(device: str, pin: bool, tokens: int = 3000,
                         host_layout: HostPoolLayout | None = None) -> None:
    """Move one request from a prefill's device pool to a HiSparse decode's device pool and
    pinned host pool with the torch executor; read every token of every layer back through
    the decode's views against the prefill's, check that no byte outside the program's rows
    changed and that every row lies in the request's pages (so on no hot or resident page,
    which the decode's block tables keep in other blocks). With `host_layout`
    "block_outermost", into a decode whose host pool is block-outermost (the placement option
    of docs/transfer.md#placement-that-transfers-well)."""
    from hisparse_plan.exchange.transfer import (
        Instance,
        TransferRequest,
        build_transfer,
        check_pattern,
        check_transfer,
        compile_transfer,
    )
    from hisparse_plan.exchange.transfer.facts.side import rank_facts
    from hisparse_plan.torch.transfer import execute, execute_request

    prefill, decode = transfer_plans(GIB // 2, GIB // 4, 4096, host_layout)
    src, dst = Instance([prefill]), Instance([decode])
    request = TransferRequest(num_tokens=tokens, source_blocks=request_blocks(prefill, tokens),
                              destination_blocks=request_blocks(decode, tokens))
    program = build_transfer(src, dst, request)
    check_transfer(program, src, dst)
    check("transfer: DeepSeek-V3.2 prefill -> HiSparse decode built and proved", True,
          f"{tokens} tokens, {len(program.rows)} rows, {program.descriptors} descriptors, "
          f"{program.bytes / 1e6:.1f} MB, host pool "
          f"{decode.host_pool.layout.value if decode.host_pool else None}")
    gpu = torch.device(device)
    with allocate(prefill, device=device, pin=False) as source, \
            allocate(decode, device=device, pin=pin) as destination:
        host = destination.host
        if host is None:
            raise CheckFailed("transfer: the HiSparse decode has no host pool")
        source.device.copy_(pattern(31, source.device.numel(), gpu))
        destination.device.copy_(pattern(32, destination.device.numel(), gpu))
        host.copy_(pattern(33, host.numel(), gpu).cpu())
        check("transfer: the prefill's pool and the decode's device pool on the device, its "
              "host pool pinned", source.device.device.type == gpu.type
              and destination.device.device.type == gpu.type and host.is_pinned() == pin,
              f"{gpu}, pinned={host.is_pinned()}")
        ours = transfer_regions(source, program.source[0])
        theirs = transfer_regions(destination, program.destination[0])
        before = {key: region.clone() for key, region in theirs.items()}
        took = seconds(lambda: execute(program, ours, theirs)) if gpu.type == "cuda" else 0.0
        if gpu.type != "cuda":
            execute(program, ours, theirs)
        layers, sent, views = rank_facts(decode).layers, source.views(), destination.views()
        tables = rank_facts(prefill).layers
        wrong = [name for name, fact in layers.items() if not torch.equal(
            request_tokens(sent[name], list(request.source_blocks[tables[name].table]),
                           tokens).to(views[name].device),
            request_tokens(views[name], list(request.destination_blocks[fact.table]), tokens))]
        check("transfer: every token of every layer reads back through the decode's views",
              not wrong and len(layers) == 122,
              f"{len(layers)} layers x {tokens} tokens"
              + (f", {program.bytes / took / 1e9:.2f} GB/s" if took else "")
              + (f"; wrong: {', '.join(wrong[:4])}" if wrong else ""))
        outside, astray = 0, 0
        for key, region in theirs.items():
            rows = [(row.dst_offset, [row.count, row.length],
                     [row.dst_stride if row.count > 1 else row.length, 1])
                    for row in program.rows if (row.dst_rank, row.dst_region) == key]
            written = byte_mask(region, rows)
            # The request's pages as the decode's views place them: a hot or resident page,
            # or another request's, is in none of these blocks.
            pages = [(int(view.storage_offset()) + block * view.stride(0), list(view.shape[1:]),
                      list(view.stride()[1:]))
                     for name, fact in layers.items() for view in [views[name]]
                     if view.untyped_storage().data_ptr() == region.untyped_storage().data_ptr()
                     for block in request.destination_blocks[fact.table]]
            outside += int(((region != before[key]) & ~written).sum())
            astray += int((written & ~byte_mask(region, pages)).sum())
        check("transfer: no byte outside the program's rows changed, every row inside the "
              "request's pages of the decode's views", outside == 0 and astray == 0,
              f"{outside} bytes changed outside the rows, {astray} written outside the pages")
        # The same request through the proved pattern, batched per pattern row: the same
        # bytes as the program's rows (no window layer here, so exactly the same).
        after = {key: region.clone() for key, region in theirs.items()}
        pattern_ = compile_transfer(src, dst)
        check_pattern(pattern_, src, dst)
        made = pattern_.instantiate(request)
        for key, region in theirs.items():
            region.copy_(before[key])
        took = seconds(lambda: execute_request(made, ours, theirs)) if gpu.type == "cuda" \
            else 0.0
        if gpu.type != "cuda":
            execute_request(made, ours, theirs)
        differ = sum(int((theirs[key] != after[key]).sum()) for key in theirs)
        check("transfer: the proved pattern's instance, batched per pattern row "
              "(execute_request), writes what the program's rows wrote", differ == 0,
              f"{made.entries} entries, {len(pattern_.rows)} pattern rows"
              + (f", {made.bytes / took / 1e9:.2f} GB/s" if took else "")
              + (f"; {differ} bytes differ" if differ else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-gib", type=float, default=8.0)
    parser.add_argument("--device-gib", type=float, default=8.0)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--keep-going", action="store_true",
                        help="run every section after a failure and count the failed ones")
    parser.add_argument("--only", default="",
                        help="comma-separated section names to run (default: all)")
    args = parser.parse_args()
    on_cpu = torch.device(args.device).type == "cpu"
    if not on_cpu and not torch.cuda.is_available():
        print("gpu_check needs a CUDA device; none here", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{'CPU dry run' if on_cpu else torch.cuda.get_device_name(torch.device(args.device))}",
          flush=True)
    index = torch.device(args.device).index or 0
    small_host = min(args.host_gib, 2.0)
    sections: list[tuple[str, Callable[[], None]]] = [
        ("pinned pools", lambda: pinned_pools(
            deepseek(args.host_gib, int(args.device_gib * GIB)), args.device)),
        ("rollback", lambda: rollback(index)),
        ("interrupted registration", lambda: interrupted_registration(index)),
        ("NUMA", lambda: numa_placement(deepseek(small_host, GIB), args.device)),
        ("shared pool", lambda: shared_pool(small_host, args.device)),
        ("refusals", lambda: refusals(args.device)),
        ("versus torch pinned", lambda: versus_torch_pinned(int(args.host_gib * GIB),
                                                            args.device)),
        ("regular plans", lambda: regular_plans(int(args.device_gib * GIB), args.device)),
        ("SGLang plans", lambda: sglang_plans(args.device)),
        ("SGLang Mamba", lambda: sglang_mamba(args.device)),
        ("transfer", lambda: transfer_to_hisparse(args.device, pin=not on_cpu)),
        ("transfer-placement", lambda: transfer_to_hisparse(
            args.device, pin=not on_cpu, host_layout="block_outermost")),
        ("staged transfer", lambda: staged_transfers(args.device, check)),
        ("meta", meta_golden),
    ]
    chosen = set(args.only.split(",")) - {""} or {name for name, _ in sections}
    if on_cpu:
        chosen &= CPU_SECTIONS
    sections = [(name, section) for name, section in sections if name in chosen]
    failed: list[str] = []
    for name, section in sections:
        try:
            section()
        except CheckFailed:
            failed.append(name)
        except Exception:  # a broken section is reported; the next one still runs
            traceback.print_exc()
            print(f"FAIL {name}: raised", flush=True)
            failed.append(name)
        if failed and not args.keep_going:
            return 1
    took = time.perf_counter() - started
    if failed:
        print(f"{len(failed)} of {len(sections)} sections failed in {took:.1f} s: "
              f"{', '.join(failed)}")
        return 1
    print(f"all checks passed in {took:.1f} s")
    return 0


def meta_golden() -> None:
    report = meta_check(hp.plan(hp.PlanRequest.model_validate_json(
        (DATA / "deepseek_v32_fp8.request.json").read_text())))
    check("DeepSeek-V3.2 golden plan on meta", report.layers == 244,
          f"{report.host_bytes / GIB:.2f} GiB host, {report.device_bytes / GIB:.2f} GiB device")

if __name__ == "__main__":
    sys.exit(main())
