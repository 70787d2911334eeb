"""Transfer programs for one long request (issue 29), in one run: descriptors per request for
DeepSeek-V3.2 and GLM-5 per layout of the pools, NIXL loopback bandwidth of a program against
one contiguous copy of the same bytes, and the time to build and prove the program for a
163,840-token request against the transfer's own time.

    .venv/bin/python benchmarks/bench_transfer.py [--tokens N] [--repeat K] [--nixl-tokens N]

Descriptors: each prefill (vLLM, no HiSparse, 80 GiB of KV, in each of the layouts that pack
latent rows beside index keys) moves one request to vLLM with HiSparse (index keys in the GPU
pool, in each block-outermost layout, the only ones that pack its pages; latent rows in the
pinned host pool, layer-outermost whatever the layout), to vLLM without HiSparse in the
prefill's layout, and to SGLang (per-layer buffers, 656-byte fp8 rows). The request's blocks
are one run on each side, so every figure is the cost per contiguous run of blocks (a request
split in R runs costs R times as much).
`rows` is what the program lists, `descriptors` the contiguous copies NIXL posts (a row
whose chunks follow one another is one, any other row one per chunk).

Placement option (docs/transfer.md#placement-that-transfers-well): DeepSeek-V3.2 BLNHC prefill
-> vLLM HiSparse decode with vLLM's layer-outermost host pool and with the block-outermost one,
descriptors per request and per run of blocks (`placement_descriptors`; `placement_plans` gives
the pair's plans, sized to a request for a NIXL run).

Bandwidth: two processes on this machine (DRAM to DRAM over UCX, nixl-cu12): the decode
registers its regions, the prefill posts the program with the NIXL executor, then the same
total bytes as one contiguous descriptor; each timed from transfer() to DONE (medians of
`--repeat` after a warm-up), the program's bytes checked against the reference executor.

Build and prove: DeepSeek-V3.2 BLNHC prefill to vLLM HiSparse, 163,840 tokens, in runs of 16
blocks (fragmented as a serving prefill's free list is), against that program's bytes over
the measured program bandwidth.

Pattern (the acceptance figures of docs/transfer.md#how-a-connector-uses-it): DeepSeek-V3.2
BLNHC prefill -> vLLM HiSparse at 163,840 tokens and Llama-3-70B TP 2 -> TP 1 at 131,072
tokens, runs of 16 blocks: compile + check_pattern once; NIXL lists prepared once over each
side's regions (registered as reserved, untouched address space: nothing is copied, so pools
of any size fit); the process keeps freed heap memory (keep_freed_heap); per request,
instantiate + make_prepped_xfer (the handle an engine then posts with transfer()), against
one contiguous numpy copy of the request's bytes at the copy bandwidth measured in the same
run (a copy of COPY_BYTES, timed `--repeat` times: the request's own bytes twice would not
fit this machine's memory).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Callable
from itertools import pairwise
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import (
    Instance,
    RankRegions,
    TransferProgram,
    TransferRequest,
    build_transfer,
    check_transfer,
    tables,
)
from hisparse_plan.exchange.transfer.executors.reference import Buffers, addresses, buffers, execute
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.presets import Settings, build_request, load_preset

GIB = 2**30
LAYOUTS = (KVCacheLayout.BLNHC, KVCacheLayout.BLHNC, KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)
HISPARSE_LAYOUTS = LAYOUTS[:2]
"""A HiSparse device pool packs index keys of 13 page sizes in one block: block-outermost only."""
SCRATCH = (0, "contiguous")
Blocks = Callable[[Plan, int], dict[str, list[int]]]


def vllm(model: str, layout: KVCacheLayout, hisparse: bool, kv_bytes: int = 80 * GIB,
         host_bytes: int = 400 * GIB, max_model_len: int | None = None) -> Plan:
    settings = Settings(layout=layout, gpu_mem_bytes=kv_bytes, hisparse=hisparse,
                        host_pool_bytes=host_bytes if hisparse else None,
                        max_model_len=max_model_len)
    return hp.plan(build_request(load_preset(model).architecture, settings))


def sglang(model: str) -> Plan:
    from hisparse_plan.adapters.sglang.request import sglang_request
    from hisparse_plan.models.sglang_settings import SGLangSettings

    engine = SGLangSettings(name="sglang", context_length=163840, kv_cache_dtype="fp8_e4m3",
                            max_running_requests=8)
    request = sglang_request(load_preset(model).architecture, engine, available_bytes=80 * GIB)
    return hp.plan_for_engine(request)


def in_runs(run: int | None, shuffle: bool = False) -> Blocks:
    """Each table's blocks: one run, runs of `run` ids one apart, or shuffled ids."""
    def blocks(plan: Plan, tokens: int) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        start: dict[int, int] = {}
        for key, table in tables(plan).items():
            count = 1 if table.state else -(-tokens // table.block_tokens)
            first = start.get(table.num_blocks, table.padding_blocks)
            if shuffle:
                ids = random.Random(count).sample(range(first, table.num_blocks), count)
            else:
                step = run or count
                ids = [first + i + i // step for i in range(count)]
            start[table.num_blocks] = max(ids) + 1
            found[key] = ids
        return found
    return blocks


def timed(work: Callable[[], object], repeat: int) -> tuple[object, float]:
    samples, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = work()
        samples.append(time.perf_counter() - started)
    return result, statistics.median(samples)


def measure(source: Plan, destination: Plan, blocks: Blocks, tokens: int, repeat: int
            ) -> tuple[TransferProgram, float, float, int]:
    request = TransferRequest(num_tokens=tokens, source_blocks=blocks(source, tokens),
                              destination_blocks=blocks(destination, tokens))
    # Every model here runs an e4m3 cache; SGLang's plan does not name its fp8.
    src = Instance([source], cache_dtype="fp8_e4m3")
    dst = Instance([destination], cache_dtype="fp8_e4m3")
    program, build = timed(lambda: build_transfer(src, dst, request), repeat)
    assert isinstance(program, TransferProgram)
    _, prove = timed(lambda: check_transfer(program, src, dst), repeat)
    runs = max(_runs(ids) for ids in request.source_blocks.values())
    runs = max(runs, *(_runs(ids) for ids in request.destination_blocks.values()))
    return program, build, prove, runs


def _runs(ids: list[int]) -> int:
    return 1 + sum(1 for a, b in pairwise(ids) if b != a + 1)


def descriptor_table(tokens: int) -> None:
    print(f"\n## Descriptors per request ({tokens:,} tokens, blocks one run on each side: "
          "figures are per contiguous run of blocks)")
    print(f"{'model':<14} {'prefill':<7} {'decode':<30} {'rows':>6} {'descriptors':>11} "
          f"{'bytes/descr':>11} {'GiB':>6}")
    for model in ("deepseek-v3.2", "glm-5"):
        other = sglang(model)
        hisparse = {layout: vllm(model, layout, True) for layout in HISPARSE_LAYOUTS}
        for layout in LAYOUTS:
            prefill = vllm(model, layout, False)
            decodes = [(f"vLLM HiSparse, device {device.value}", plan)
                       for device, plan in hisparse.items()]
            decodes += [("vLLM, same layout", prefill), ("SGLang per-layer", other)]
            for name, destination in decodes:
                program, _, _, _ = measure(prefill, destination, in_runs(None), tokens, 1)
                print(f"{model:<14} {layout.value:<7} {name:<30} {len(program.rows):>6} "
                      f"{program.descriptors:>11} {program.bytes // program.descriptors:>11} "
                      f"{program.bytes / GIB:>6.2f}", flush=True)


PLACEMENT_PAIR = "DeepSeek-V3.2 BLNHC -> HiSparse decode, placement option"
"""The pair of docs/transfer.md#placement-that-transfers-well: the decode's host pool
block-outermost (hisparse.host_pool_layout), lined up with the prefill's block."""


def placement_plans(tokens: int | None = None, *, option: bool = True) -> tuple[Plan, Plan]:
    """(prefill, decode) of PLACEMENT_PAIR (vLLM's own host pool with `option` False); with
    `tokens`, pools sized to one request of that many tokens (as `bandwidth` sizes them), so
    two processes can hold them in DRAM."""
    row = 61 * 800
    kv, host, device = ((80 * GIB, 400 * GIB, 80 * GIB) if tokens is None else
                        (tokens * row * 9 // 8, tokens * row * 9 // 8, tokens * 64_000 + GIB // 4))
    arch = load_preset("deepseek-v3.2").architecture
    prefill = hp.plan(build_request(arch, Settings(
        layout=KVCacheLayout.BLNHC, gpu_mem_bytes=kv, hisparse=False, max_model_len=tokens)))
    decode = hp.plan(build_request(arch, Settings(
        layout=KVCacheLayout.BLNHC, gpu_mem_bytes=device, hisparse=True, host_pool_bytes=host,
        max_model_len=tokens, host_pool_layout="block_outermost" if option else None)))
    return prefill, decode


def placement_descriptors(tokens: int) -> None:
    """Descriptors per request and per contiguous run of blocks of PLACEMENT_PAIR, before (vLLM's
    layer-outermost host pool) and after (the option): the request one run, then runs of 16."""
    print(f"\n## {PLACEMENT_PAIR}: descriptors per request ({tokens:,} tokens)")
    print(f"{'host pool':<16} {'blocks':<11} {'rows':>6} {'descriptors':>11} {'runs':>5} "
          f"{'rows/run':>8} {'descr/run':>9} {'descr/block':>11}")
    for option in (False, True):
        prefill, decode = placement_plans(option=option)
        for run in (None, 16):
            program, _, _, runs = measure(prefill, decode, in_runs(run), tokens, 1)
            blocks = -(-tokens // 64)
            print(f"{'block-outermost' if option else 'layer-outermost':<16} "
                  f"{'one run' if run is None else f'runs of {run}':<11} {len(program.rows):>6} "
                  f"{program.descriptors:>11,} {runs:>5} {len(program.rows) / runs:>8g} "
                  f"{program.descriptors / runs:>9g} {program.descriptors / blocks:>11g}",
                  flush=True)


def _digest(regions: Buffers) -> str:
    digest = hashlib.sha256()
    for key in sorted(regions):
        if key != SCRATCH:
            digest.update(regions[key].tobytes())
    return digest.hexdigest()


def decode_process(destination: list[RankRegions], scratch: int, pipe: Connection) -> None:
    """Hold the decode's regions (random bytes, seed 2) and a scratch region, registered with
    NIXL; after the prefill's transfers, send back a digest of the regions."""
    from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint

    regions = buffers(destination, fill=None, seed=2)
    regions[SCRATCH] = np.zeros(scratch, dtype=np.uint8)
    registered = addresses(regions)
    side = endpoint("decode", registered)
    pipe.send((side.metadata, registered))
    pipe.recv()
    pipe.send(_digest(regions))


def _post_timed(agent: Any, local: object, remote: object, peer: str,  # noqa: ANN401
                repeat: int) -> float:
    """Median seconds from transfer() to DONE over `repeat` posts, after one warm-up."""
    samples = []
    for _ in range(repeat + 1):
        handle = agent.initialize_xfer("WRITE", local, remote, peer, b"bench")
        started = time.perf_counter()
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        samples.append(time.perf_counter() - started)
        if state != "DONE":
            raise RuntimeError(f"NIXL reported the transfer as {state}")
        agent.release_xfer_handle(handle)
    return statistics.median(samples[1:])


def bandwidth(tokens: int, repeat: int) -> tuple[float, float]:
    """GB/s of DeepSeek-V3.2 BLNHC prefill -> vLLM HiSparse's program and of one contiguous
    copy of its bytes, NIXL between two processes."""
    from hisparse_plan.exchange.transfer.executors.nixl_direct import descriptors, endpoint

    # Pools sized to the request (a latent row and index key per layer per token; HiSparse's
    # device pool also keeps hot pages for every sequence), so both processes hold them.
    row = 61 * 800
    source_plan = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, False, kv_bytes=tokens * row * 9 // 8,
                       max_model_len=tokens)
    destination_plan = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, True,
                            kv_bytes=tokens * 64_000 + GIB // 4, host_bytes=tokens * row * 9 // 8,
                            max_model_len=tokens)
    src, dst = Instance([source_plan]), Instance([destination_plan])
    blocks = in_runs(None)
    request = TransferRequest(num_tokens=tokens, source_blocks=blocks(source_plan, tokens),
                              destination_blocks=blocks(destination_plan, tokens))
    program = build_transfer(src, dst, request)
    check_transfer(program, src, dst)
    source = buffers(program.source, fill=None, seed=1)
    source[SCRATCH] = np.frombuffer(os.urandom(program.bytes), dtype=np.uint8)
    expected = buffers(program.destination, fill=None, seed=2)
    execute(program, source, expected)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=decode_process,
                            args=(program.destination, program.bytes, theirs))
    child.start()
    try:
        metadata, remote_addresses = ours.recv()
        side = endpoint("prefill", addresses(source))
        peer = side.agent.add_remote_agent(metadata)
        local_descs, remote_descs = descriptors(program, addresses(source), remote_addresses)
        agent, kind = side.agent, side.mem_type
        program_s = _post_timed(agent, agent.get_xfer_descs(local_descs, kind),
                                agent.get_xfer_descs(remote_descs, kind), peer, repeat)
        one = np.array([[source[SCRATCH].ctypes.data, program.bytes, 0]], dtype=np.uint64)
        there = np.array([[remote_addresses[SCRATCH][0], program.bytes, 0]], dtype=np.uint64)
        contiguous_s = _post_timed(agent, agent.get_xfer_descs(one, kind),
                                   agent.get_xfer_descs(there, kind), peer, repeat)
        ours.send("done")
        verified = ours.recv() == _digest(expected)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.terminate()
    gbps, one_gbps = program.bytes / program_s / 1e9, program.bytes / contiguous_s / 1e9
    print(f"\n## NIXL loopback (two processes, DRAM to DRAM over UCX), DeepSeek-V3.2 BLNHC "
          f"prefill -> vLLM HiSparse, {tokens:,} tokens, medians of {repeat}")
    print(f"program:    {program.bytes / 1e6:9.1f} MB in {len(local_descs):,} descriptors "
          f"({program.bytes // len(local_descs):,} B each): {program_s * 1e3:8.1f} ms, "
          f"{gbps:6.2f} GB/s; bytes {'verified' if verified else 'WRONG'}")
    print(f"contiguous: {program.bytes / 1e6:9.1f} MB in 1 descriptor: "
          f"{contiguous_s * 1e3:8.1f} ms, {one_gbps:6.2f} GB/s")
    print(f"program / contiguous bandwidth: {gbps / one_gbps:.2f}")
    if not verified:
        raise SystemExit("the program's bytes did not land where the reference executor puts them")
    return gbps, one_gbps


def build_and_prove(tokens: int, repeat: int, gbps: float | None) -> None:
    prefill = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, False)
    decode = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, True)
    program, build, prove, runs = measure(prefill, decode, in_runs(16), tokens, repeat)
    print(f"\n## Build and prove against the transfer, DeepSeek-V3.2 BLNHC prefill -> vLLM "
          f"HiSparse, {tokens:,} tokens in {runs} runs of 16 blocks, medians of {repeat}")
    print(f"rows {len(program.rows):,}, descriptors {program.descriptors:,}, "
          f"{program.bytes / 1e9:.2f} GB")
    print(f"build {build * 1e3:.0f} ms, prove {prove * 1e3:.0f} ms, "
          f"together {(build + prove) * 1e3:.0f} ms")
    if gbps is not None:
        moving = program.bytes / (gbps * 1e9)
        print(f"transfer at the measured program bandwidth ({gbps:.2f} GB/s): "
              f"{moving * 1e3:.0f} ms; build + prove = {(build + prove) / moving:.2f} x the "
              "transfer's own time")


COPY_BYTES = 2 * GIB


def copy_bandwidth(repeat: int) -> tuple[float, float]:
    """Bytes per second of one contiguous numpy copy (pages touched): by the wall clock and by
    the copying thread's CPU time, medians of `repeat` after a warm-up."""
    a = np.ones(COPY_BYTES, dtype=np.uint8)
    b = np.zeros(COPY_BYTES, dtype=np.uint8)
    wall, cpu = [], []
    for _ in range(repeat + 1):
        started, started_cpu = time.perf_counter(), time.thread_time()
        np.copyto(b, a)
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
    return COPY_BYTES / statistics.median(wall[1:]), COPY_BYTES / statistics.median(cpu[1:])


def reserved(regions: list[RankRegions]) -> tuple[dict[tuple[int, str], tuple[int, int]],
                                                   list[Any]]:
    """Address space for each region, reserved and never touched (MAP_NORESERVE)."""
    import mmap

    no_reserve = 0x4000  # MAP_NORESERVE (Linux); the mmap module does not name it
    kept, found = [], {}
    for rank in regions:
        for region in rank.regions:
            memory = mmap.mmap(-1, max(region.size, 1),
                               flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | no_reserve)
            view = np.frombuffer(memory, dtype=np.uint8)
            kept.append((memory, view))
            found[(rank.rank, region.name)] = (int(view.ctypes.data), region.size)
    return found, kept


def pattern_pair(name: str, src: Instance, dst: Instance, tokens: int, repeat: int,
                 bandwidth_bps: tuple[float, float]) -> None:
    from hisparse_plan.exchange.transfer import check_pattern, compile_transfer
    from hisparse_plan.exchange.transfer.executors import nixl_prepared
    from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint

    started = time.perf_counter()
    pattern = compile_transfer(src, dst)
    compiled = time.perf_counter()
    proof = check_pattern(pattern, src, dst)
    proved = time.perf_counter()
    blocks = in_runs(16)
    request = TransferRequest(num_tokens=tokens, source_blocks=blocks(src.plans[0], tokens),
                              destination_blocks=blocks(dst.plans[0], tokens))
    ours, kept_ours = reserved(pattern.source)
    theirs, kept_theirs = reserved(pattern.destination)
    # The prefill only initiates: its agent progresses when post() polls (see endpoint).
    prefill = endpoint(f"prefill-{name}", ours, progress_thread=False)
    decode = endpoint(f"decode-{name}", theirs)
    before = time.perf_counter()
    prepared = nixl_prepared.prepare(prefill, decode.metadata, pattern, theirs)
    ready = time.perf_counter()
    samples, instantiate_s, cpu = [], [], []
    made = pattern.instantiate(request)  # warm-up (the pattern's columns are made once)
    for _ in range(max(repeat, 40) + 1):
        at, at_cpu = time.perf_counter(), time.thread_time()
        made = pattern.instantiate(request)
        middle = time.perf_counter()
        handle = nixl_prepared.make(prefill, prepared, made)
        samples.append(time.perf_counter() - at)
        cpu.append(time.thread_time() - at_cpu)
        instantiate_s.append(middle - at)
        prefill.agent.release_xfer_handle(handle)
    per_request, best = statistics.median(samples[1:]), min(samples[1:])
    per_request_cpu = statistics.median(cpu[1:])
    copy_s, copy_cpu = made.bytes / bandwidth_bps[0], made.bytes / bandwidth_bps[1]
    print(f"\n### {name}, {tokens:,} tokens in runs of 16 blocks "
          f"({made.bytes / 1e9:.2f} GB)")
    print(f"compile {1e3 * (compiled - started):.0f} ms + check_pattern "
          f"{1e3 * (proved - compiled):.0f} ms (once; {proof.rows} rows per period, "
          f"{proof.links} links, {proof.token_counts} token counts and residues, "
          f"{proof.boxes} boxes)")
    print(f"prepare (once): {prepared.entries[0]:,} + {prepared.entries[1]:,} prepared copies "
          f"(source + destination lists), {1e3 * (ready - before):.0f} ms")
    print(f"per request: {made.entries:,} entries (rows x blocks), {made.chunks:,} copies "
          f"posted; instantiate {1e3 * statistics.median(instantiate_s[1:]):.2f} ms, "
          f"+ make_prepped_xfer = {1e3 * per_request:.2f} ms (best {1e3 * best:.2f} ms; "
          f"medians of {len(samples) - 1})")
    print(f"one contiguous numpy copy of the request's bytes: {1e3 * copy_s:.0f} ms; "
          f"instantiate + post = {100 * per_request / copy_s:.2f}% of it (best "
          f"{100 * best / copy_s:.2f}%)")
    print(f"by the thread's CPU time: instantiate + post {1e3 * per_request_cpu:.2f} ms, the "
          f"copy {1e3 * copy_cpu:.0f} ms: {100 * per_request_cpu / copy_cpu:.2f}%")
    for handle in (prepared.local, prepared.remote):
        handle.release()
    staged_post(name, pattern, request, prefill, theirs, copy_s, repeat)
    del kept_ours, kept_theirs


def staged_post(name: str, pattern: Any, request: TransferRequest, prefill: Any,  # noqa: ANN401
                theirs: dict[tuple[int, str], tuple[int, int]], copy_s: float,
                repeat: int) -> None:
    """The staged program of the same pair, and which of the two the cost model picks on
    each link: proved once; per request, its slots and rounds instantiated and each round's
    descriptors made (initialize_xfer, the handle an engine then posts)."""
    from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint
    from hisparse_plan.exchange.transfer.executors.nixl_staged import run_entries
    from hisparse_plan.exchange.transfer.pattern.cost import GPU_LINK, LOOPBACK, choose
    from hisparse_plan.exchange.transfer.pattern.staging import compile_staged, slots_for

    staged = compile_staged(pattern, slots_for(pattern, GIB))
    print(f"cost model, loopback: {choose(staged, LOOPBACK).describe()}")
    print(f"cost model, GPU link: {choose(staged, GPU_LINK).describe()}")
    made = staged.instantiate(request)
    staging, kept = reserved(made.staging_regions())
    decode = endpoint(f"decode-staging-{name}", staging)
    peer = prefill.agent.add_remote_agent(decode.metadata)
    agent = prefill.agent
    samples, descriptors = [], 0
    for _ in range(max(repeat, 40) + 1):
        at = time.perf_counter()
        made = staged.instantiate(request)
        descriptors = 0
        for round_ in made.rounds:
            local, remote = run_entries(staged, round_, prefill.addresses, staging)
            handle = agent.initialize_xfer("WRITE", agent.get_xfer_descs(local, "DRAM"),
                                           agent.get_xfer_descs(remote, "DRAM"), peer, b"s")
            descriptors += len(local)
            agent.release_xfer_handle(handle)
        samples.append(time.perf_counter() - at)
    per_request, best = statistics.median(samples[1:]), min(samples[1:])
    print(f"staged, per request: {len(made.rounds)} rounds of at most 1 GiB, {descriptors:,} "
          f"descriptors posted; instantiate + post {1e3 * per_request:.2f} ms (best "
          f"{1e3 * best:.2f} ms) = {100 * per_request / copy_s:.2f}% of the copy (best "
          f"{100 * best / copy_s:.2f}%); the destination then rearranges "
          f"{made.direct.entries:,} entries in "
          f"{sum(r.moves.rows.size for r in made.rounds):,} moves")
    del kept


def keep_freed_heap() -> None:
    """glibc: serve allocations up to 32 MiB from the heap and keep freed memory there.
    make_prepped_xfer allocates tens of MiB per request (its copies' descriptors); by
    default glibc maps them fresh and returns them on release, so every request pays a page
    fault per 4 KiB (about 45% of a post here). A long-running connector tunes its process
    the same way (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in its environment)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's mallopt parameters
    libc.mallopt(m_mmap_threshold, 32 * 2**20)
    libc.mallopt(m_trim_threshold, 2**30)


def pattern_table(repeat: int) -> None:
    keep_freed_heap()
    bandwidth_bps = copy_bandwidth(repeat)
    print(f"\n## Pattern: proved once, each request instantiated and posted; contiguous "
          f"numpy copy {bandwidth_bps[0] / 1e9:.2f} GB/s by the wall clock, "
          f"{bandwidth_bps[1] / 1e9:.2f} GB/s by its CPU time ({COPY_BYTES // GIB} GiB, "
          f"medians of {repeat})")
    tokens = 163840
    row = 61 * 800
    prefill = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, False, kv_bytes=tokens * row * 9 // 8,
                   max_model_len=tokens)
    decode = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, True, kv_bytes=tokens * 64_000 + GIB,
                  host_bytes=tokens * row * 9 // 8, max_model_len=tokens)
    pattern_pair("DeepSeek-V3.2 BLNHC prefill -> vLLM HiSparse decode", Instance([prefill]),
                 Instance([decode]), tokens, repeat, bandwidth_bps)
    tokens = 131072
    per_token = 80 * 8 * 128 * 2 * 2
    for layout in (KVCacheLayout.BLHNC, KVCacheLayout.LBHNC):
        plans = []
        for tp in (2, 1):
            settings = Settings(layout=layout, tp=tp, max_model_len=tokens,
                                gpu_mem_bytes=tokens * per_token // tp * 9 // 8)
            plans.append(hp.plan(build_request(load_preset("llama-3-70b").architecture,
                                               settings)))
        pattern_pair(f"Llama-3-70B TP 2 -> TP 1, {layout.value}",
                     Instance([plans[0], plans[0]]), Instance([plans[1]]), tokens, repeat,
                     bandwidth_bps)


def copy_speed_table(repeat: int, tokens: int) -> None:
    """Issue 41's pairs at `tokens` (benchmarks/copy_speed.py)."""
    from copy_speed import Pair, copy_speed
    from hisparse_plan.adapters.sglang.request import sglang_request
    from hisparse_plan.models.sglang_settings import SGLangSettings

    print(f"\n## Copy speed: NIXL loopback in one process (two agents, UCX, DRAM), "
          f"{tokens:,} tokens, medians of {repeat}")
    pairs = []
    per_token = 80 * 8 * 128 * 2 * 2
    plans = [hp.plan(build_request(load_preset("llama-3-70b").architecture, Settings(
        layout=KVCacheLayout.BLNHC, tp=tp, max_model_len=tokens,
        gpu_mem_bytes=tokens * per_token // tp * 9 // 8))) for tp in (2, 1)]
    pairs.append(Pair("Llama-3-70B vLLM TP 2 -> TP 1, BLNHC", Instance([plans[0], plans[0]]),
                      Instance([plans[1]]), tokens))
    per_token = 32 * 8 * 128 * 2 * 2
    architecture = load_preset("llama-3-8b").architecture
    # Past Llama-3-8B's 8,192 positions where `tokens` asks for it, as both engines allow
    # (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN, SGLang's SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN).
    prefill = hp.plan(build_request(architecture, Settings(
        block_size=64, max_model_len=tokens, gpu_mem_bytes=tokens * per_token * 5 // 4,
        allow_long_context=True)))
    engine = SGLangSettings(name="sglang", context_length=tokens, page_size=16,
                            max_running_requests=2, allow_overwrite_longer_context_len=True)
    decode = hp.plan_for_engine(sglang_request(architecture, engine,
                                               available_bytes=tokens * per_token * 3 // 2))
    pairs.append(Pair("Llama-3-8B vLLM block 64 -> SGLang page 16", Instance([prefill]),
                      Instance([decode]), tokens))
    for option in (False, True):
        sides = placement_plans(tokens, option=option)
        name = "DeepSeek-V3.2 BLNHC prefill -> vLLM HiSparse decode"
        pairs.append(Pair(f"{name}, placement option" if option else name,
                          Instance([sides[0]]), Instance([sides[1]]), tokens))
    for pair in pairs:
        copy_speed(pair, in_runs(16), repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=163840)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nixl-tokens", type=int, default=8192,
                        help="tokens of the request moved over NIXL (its pools are sized "
                        "to it: both processes hold them in DRAM)")
    parser.add_argument("--no-nixl", action="store_true", help="skip the NIXL section")
    parser.add_argument("--pattern-only", action="store_true",
                        help="only the pattern section (the acceptance figures)")
    parser.add_argument("--copy-speed", action="store_true",
                        help="only the copy-speed section (staged transfers against one "
                        "contiguous copy)")
    parser.add_argument("--copy-tokens", type=int, default=16384)
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    if args.copy_speed:
        copy_speed_table(args.repeat, args.copy_tokens)
    else:
        pattern_table(args.repeat)
    if not args.pattern_only and not args.copy_speed:
        descriptor_table(args.tokens)
        placement_descriptors(args.tokens)
        gbps = None if args.no_nixl else bandwidth(args.nixl_tokens, args.repeat)[0]
        build_and_prove(args.tokens, args.repeat, gbps)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"whole run {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
