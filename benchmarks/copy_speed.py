"""`bench_transfer.py --copy-speed`: each pair's transfer against one contiguous copy of the
same bytes over the same NIXL pair, and its local rearrangement against one local copy of the
bytes it moves (issue 41). One process holds both sides' regions (real memory, random bytes)
and two NIXL agents over UCX, DRAM to DRAM; the request's blocks come in runs of 16.

For each pair: the pattern compiled and proved, the staged pattern proved, the cost model's
choice for this loopback and for a GPU link printed; then the staged program: for `repeat`
requests after a warm-up, each round (the staging region
holds `STAGING_BYTES` per destination rank) interleaves: one contiguous descriptor of the
round's slab bytes (source region -> staging region), the round's phase 1 (one descriptor per
run of blocks), one numpy copy of the round's rearranged bytes (staging -> scratch), the
round's rearrangement (staging -> the destination's pools). Medians of the per-request sums.
Every byte the pattern moves is then read back through the destination's regions and
compared with the source's. Where a request is at most DIRECT_COPIES copies, the direct
pattern is timed too (from NIXL prepared lists, interleaved with one contiguous copy of its
bytes) and checked again: the difference is the calibration line, the cost of one more copy.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferRequest,
    check_pattern,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.executors.reference import Buffers, addresses, buffers
from hisparse_plan.exchange.transfer.pattern.check_staged import check_staged
from hisparse_plan.exchange.transfer.pattern.cost import GPU_LINK, LOOPBACK, choose
from hisparse_plan.exchange.transfer.pattern.instance import Instantiated
from hisparse_plan.exchange.transfer.pattern.staging import compile_staged, slots_for
from hisparse_plan.exchange.transfer.program.transfer_program import STAGING_REGION

STAGING_BYTES = 1 << 30
DIRECT_COPIES = 200_000
"""The direct pattern is timed too where a request is at most this many copies (the others
take minutes a request over loopback)."""
Blocks = Callable[[Any, int], dict[str, list[int]]]


@dataclass(frozen=True)
class Pair:
    name: str
    source: Instance
    destination: Instance
    tokens: int


def verify(made: Instantiated, source: Buffers, destination: Buffers) -> bool:
    """Every chunk the request's rows move, compared between the two sides (row by row of
    the pattern, over all of the request's blocks at once)."""
    pattern = made.pattern
    for index in np.unique(made.rows).tolist():
        row = pattern.rows[index]
        chosen = made.rows == index
        views = []
        for buffer, offset, block_stride, stride, ids in (
                (source[(row.src_rank, row.src_region)], row.src_offset,
                 row.src_block_stride, row.src_stride, made.src_ids[chosen]),
                (destination[(row.dst_rank, row.dst_region)], row.dst_offset,
                 row.dst_block_stride, row.dst_stride, made.dst_ids[chosen])):
            blocks = int(ids.max()) + 1
            whole = as_strided(buffer[offset:], shape=(blocks, row.count, row.length),
                               strides=(block_stride, stride if row.count > 1 else row.length,
                                        1))
            views.append(whole[ids])
        if not np.array_equal(views[0], views[1]):
            return False
    return True


def _contiguous(source: np.ndarray, there: tuple[int, int], moved: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """`moved` bytes as contiguous descriptors from the start of `source` to the start of
    the region `there` (address, size), each as long as both allow (later pieces overwrite
    earlier ones: only their time counts)."""
    piece = min(source.nbytes, there[1])
    pieces = -(-moved // piece)
    sizes = [moved // pieces + (1 if i < moved % pieces else 0) for i in range(pieces)]
    one = np.array([[source.ctypes.data, size, 0] for size in sizes], dtype=np.uint64)
    return one, np.array([[there[0], size, 0] for size in sizes], dtype=np.uint64)


def _post_contiguous(prefill: Any, peer: str, source: np.ndarray,  # noqa: ANN401
                     there: tuple[int, int], moved: int) -> float:
    from hisparse_plan.exchange.transfer.executors.nixl_direct import run_to_done

    one, far = _contiguous(source, there, moved)
    at = time.perf_counter()
    handle = prefill.agent.initialize_xfer("WRITE", prefill.agent.get_xfer_descs(one, "DRAM"),
                                           prefill.agent.get_xfer_descs(far, "DRAM"), peer,
                                           b"one")
    run_to_done(prefill, handle, timeout_s=120)
    return time.perf_counter() - at


def medians_of(samples: list[float]) -> float:
    return statistics.median(samples[1:])


def _direct(name: str, prefill: Any, prepared: Any, peer: str,  # noqa: ANN401
            direct: Instantiated, largest: np.ndarray, there: tuple[int, int], repeat: int,
            checked: Callable[[], bool], local_bps: float) -> None:
    """The direct pattern from prepared lists, interleaved with one contiguous copy of its
    bytes; the difference gives the cost model's cost of one more copy."""
    from hisparse_plan.exchange.transfer.executors import nixl_prepared

    transfer: list[float] = []
    contiguous: list[float] = []
    for _ in range(repeat + 1):
        contiguous.append(_post_contiguous(prefill, peer, largest, there, direct.bytes))
        at = time.perf_counter()
        nixl_prepared.post(prefill, prepared, direct, timeout_s=120)
        transfer.append(time.perf_counter() - at)
    note = "bytes verified" if checked() else "BYTES WRONG"
    direct_s, one_s = medians_of(transfer), medians_of(contiguous)
    print(f"copy speed {name} (direct): {direct_s / one_s:.2f} x one contiguous copy "
          f"({direct.chunks:,} descriptors, {note}); {1e3 * direct_s:.0f} ms against "
          f"{1e3 * one_s:.0f} ms, medians of {repeat}; nothing to rearrange")
    per_copy = max(direct_s - one_s, 0.0) / max(direct.chunks - 1, 1)
    print(f"calibration: {1e6 * per_copy:.2f} us a copy past its bytes; link "
          f"{direct.bytes / one_s / 1e9:.2f} GB/s, local copy {local_bps / 1e9:.2f} GB/s "
          "(cost.LOOPBACK holds such figures)")
    if note != "bytes verified":
        raise SystemExit(f"{name}: the direct transfer's bytes differ from the source's")


def copy_speed(pair: Pair, blocks: Blocks, repeat: int) -> None:
    from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint
    from hisparse_plan.exchange.transfer.executors.nixl_staged import post_round, run_entries
    from hisparse_plan.exchange.transfer.executors.rearrange import rearrange

    src, dst = pair.source, pair.destination
    started = time.perf_counter()
    pattern = compile_transfer(src, dst)
    staged = compile_staged(pattern, slots_for(pattern, STAGING_BYTES))
    proof = check_staged(staged, src, dst)
    check_pattern(pattern, src, dst)
    proved = time.perf_counter() - started
    request = TransferRequest(num_tokens=pair.tokens,
                              source_blocks=blocks(src.plans[0], pair.tokens),
                              destination_blocks=blocks(dst.plans[0], pair.tokens))
    made = staged.instantiate(request)
    runs = max(1 + int(np.count_nonzero(np.diff(np.asarray(ids)) != 1))
               for ids in request.source_blocks.values())
    print(f"\n### {pair.name}, {pair.tokens:,} tokens in runs of 16 blocks "
          f"({made.bytes / 1e9:.2f} GB; compile + both proofs {1e3 * proved:.0f} ms, "
          f"{proof.slabs} slabs of {proof.slab_bytes:,} B a block, {proof.unread_bytes:,} "
          "of them read by no row)")
    print(f"cost model, loopback: {choose(staged, LOOPBACK).describe()}")
    print(f"cost model, GPU link: {choose(staged, GPU_LINK).describe()}")
    source = buffers(pattern.source, fill=None, seed=1)
    destination = buffers(pattern.destination, fill=None, seed=2)
    staging = buffers(made.staging_regions(), fill=0)
    scratch = np.zeros(max(staged.staging_bytes), dtype=np.uint8)
    prefill = endpoint(f"prefill-{pair.name}", addresses(source), progress_thread=False)
    theirs = {**addresses(destination), **addresses(staging)}
    decode = endpoint(f"decode-{pair.name}", theirs)
    from hisparse_plan.exchange.transfer.executors import nixl_prepared

    # Prepared lists hold every block's copies: made only where the direct pattern is timed.
    prepared = nixl_prepared.prepare(prefill, decode.metadata, pattern, theirs) \
        if made.direct.chunks <= DIRECT_COPIES else None
    peer = prepared.peer if prepared is not None else prefill.agent.add_remote_agent(
        decode.metadata)
    posted = sum(len(run_entries(staged, round_, prefill.addresses, theirs)[0])
                 for round_ in made.rounds)
    direct = made.direct.chunks
    print(f"descriptors per request: direct {direct:,} ({direct / runs:,.1f} per run of "
          f"blocks), staged {posted:,} ({posted / runs:,.1f} per run) in "
          f"{len(made.rounds)} rounds of at most {STAGING_BYTES >> 20} MiB a rank")
    largest = max(source.values(), key=lambda buffer: buffer.nbytes)
    transfer: list[float] = []
    contiguous: list[float] = []
    local: list[float] = []
    copy: list[float] = []
    local_cpu: list[float] = []
    copy_cpu: list[float] = []
    there = theirs[(0, STAGING_REGION)]
    for _ in range(repeat + 1):
        sums = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        for round_ in made.rounds:
            moved = int(sum(staged.slabs[s].length for s in round_.phase1.slab.tolist()))
            written = int(sum(pattern.rows[r].length * pattern.rows[r].count * n
                              for r, n in zip(round_.moves.rows.tolist(),
                                              round_.moves.size.tolist(), strict=True)))
            sums[1] += _post_contiguous(prefill, peer, largest, there, moved)
            at = time.perf_counter()
            post_round(prefill, peer, made, round_, theirs, timeout_s=120)
            sums[0] += time.perf_counter() - at
            staged_bytes = staging[(0, STAGING_REGION)]
            at, cpu = time.perf_counter(), time.thread_time()
            np.copyto(scratch[:written], staged_bytes[:written])
            sums[3] += time.perf_counter() - at
            sums[5] += time.thread_time() - cpu
            at, cpu = time.perf_counter(), time.thread_time()
            rearrange(round_, made, staging, destination)
            sums[2] += time.perf_counter() - at
            sums[4] += time.thread_time() - cpu
        for samples, value in zip((transfer, contiguous, local, copy, local_cpu, copy_cpu),
                                  sums, strict=True):
            samples.append(value)
    verified = verify(made.direct, source, destination)
    medians = [statistics.median(samples[1:])
               for samples in (transfer, contiguous, local, copy, local_cpu, copy_cpu)]
    note = "bytes verified" if verified else "BYTES WRONG"
    print(f"copy speed {pair.name} (staged): {medians[0] / medians[1]:.2f} x one contiguous copy "
          f"({posted:,} descriptors, {note}); {1e3 * medians[0]:.0f} ms against "
          f"{1e3 * medians[1]:.0f} ms, medians of {repeat}")
    print(f"rearrange {pair.name} (staged): {medians[2] / medians[3]:.2f} x one local copy "
          f"({1e3 * medians[2]:.0f} ms against {1e3 * medians[3]:.0f} ms; by the thread's CPU "
          f"time {medians[4] / medians[5]:.2f} x, {1e3 * medians[4]:.0f} ms against "
          f"{1e3 * medians[5]:.0f} ms; "
          f"{made.direct.entries:,} entries in "
          f"{sum(r.moves.rows.size for r in made.rounds):,} moves)")
    if not verified:
        raise SystemExit(f"{pair.name}: the staged transfer's bytes differ from the source's")
    if prepared is not None:
        _direct(pair.name, prefill, prepared, peer, made.direct, largest, there, repeat,
                lambda: verify(made.direct, source, destination),
                made.bytes / medians[3])
