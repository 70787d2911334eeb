"""The connector's own CPU time per request (issue 47), against one contiguous copy of the
request's bytes: HisparsePlanConnector's scheduler and worker halves driven as vLLM 0.34
calls them, for the end-to-end matrix's pairs at 131,072 tokens.

    .venv/bin/python benchmarks/bench_connector.py [--tokens N] [--repeat K] [--pair NAME]

Each pair is two instances in this process, each with its `SchedulerSide`, one `WorkerSide`
per tensor-parallel rank (a real NIXL agent over UCX, its regions registered as reserved,
untouched address space, as bench_transfer's pattern section does: nothing is copied, so
pools of any size fit) and its side channel (loopback TCP). The workers' handshake payloads
are what `WorkerSide.register` builds after binding, made here from the plan's pools (binding
needs torch tensors; tests/test_connector_vllm_e2e.py checks it on vLLM's own).

Per request, timed (thread CPU time and wall clock), everything the connector runs:
- prefill scheduler: `request_finished` (the ticket: block ids per table, lease) and
  `build_meta` (the hold);
- decode scheduler: `get_num_new_matched_tokens`, `update_state_after_alloc`, `build_meta`,
  and `request_finished` when the request ends;
- decode workers: `start` (ticket read, the pair's cached peering, each lane instantiated,
  make_prepped_xfer on its prepared lists) and `poll` (the handles' states, their release,
  the holders notified over NIXL);
- prefill workers: `start` (the lease) and `poll` until the request is let go (the readers'
  notifications read and counted, the lease dropped).
Not timed: the copy itself. The decode agent's `transfer()` and `check_xfer_state()` answer
"DONE" without posting (`NoCopy`): the lists, handles and notifications are NIXL's own.
Once per pair and reported apart: fetching the peer's payloads, compiling and proving the
pattern, cutting its lanes, preparing each lane's lists (the first request).

The baseline is bench_transfer's: one contiguous numpy copy of COPY_BYTES, by the wall
clock and by the copying thread's CPU time, scaled to the request's bytes (the pattern's
instantiated bytes). The line `connector PAIR: X% of one copy` compares CPU time with CPU
time (median of the requests; best in brackets); wall against wall follows it.

Blocks in runs of 16 on each side (a serving engine's free list), as bench_transfer's.
The process keeps freed heap memory (bench_transfer.keep_freed_heap), as a long-running
engine tunes its allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import hisparse_plan as hp
from bench_transfer import (
    COPY_BYTES,
    GIB,
    copy_bandwidth,
    in_runs,
    keep_freed_heap,
    reserved,
    vllm,
)
from hisparse_plan.connectors.protocol import (
    HandshakePayload,
    InstanceFacts,
    Region,
    plan_fingerprint,
)
from hisparse_plan.connectors.transport import Agent, SideChannel
from hisparse_plan.connectors.vllm.scheduler import SchedulerSide
from hisparse_plan.connectors.vllm.settings import Settings
from hisparse_plan.connectors.vllm.worker import WorkerSide
from hisparse_plan.exchange.transfer import (
    Instance,
    TransferRefused,
    TransferRequest,
    compile_transfer,
)
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.presets import Settings as PresetSettings
from hisparse_plan.presets import build_request, load_preset
from hisparse_plan.presets.mamba_states import GatedDeltaNetGeometry
from hisparse_plan.presets.regular import RegularArchitecture

TOKENS = 131072


class NoCopy:
    """A NIXL agent whose posts complete at once and copy nothing (module doc): every other
    call is the real agent's."""

    def __init__(self, agent: Any) -> None:  # noqa: ANN401
        self._agent = agent

    def transfer(self, handle: Any) -> str:  # noqa: ANN401
        return "DONE"

    def check_xfer_state(self, handle: Any) -> str:  # noqa: ANN401
        return "DONE"

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        return getattr(self._agent, name)


@dataclass
class Pair:
    name: str
    source: list[Plan]
    destination: list[Plan]
    source_facts: InstanceFacts = field(default_factory=InstanceFacts)
    destination_facts: InstanceFacts = field(default_factory=InstanceFacts)
    interleave: int = 1
    """The decode's --cp-kv-cache-interleave-size (a DCP decode; vLLM sets it to the block
    size for a NixlConnector pair), passed where this tree's payload and Instance carry it."""


def interleave_field(model: Any, interleave: int, role: str) -> dict[str, Any]:  # noqa: ANN401
    """{"cp_kv_cache_interleave_size": n} where `model` (HandshakePayload, Instance) has that
    field (a tree with DCP in the connector), for the decode; else nothing."""
    fields = getattr(model, "model_fields", None) or getattr(model, "__dataclass_fields__", {})
    if role != "decode" or interleave == 1 or "cp_kv_cache_interleave_size" not in fields:
        return {}
    return {"cp_kv_cache_interleave_size": interleave}


@dataclass
class Side:
    """One instance of a pair: its scheduler half, its worker halves, its side channel."""

    settings: Settings
    scheduler: SchedulerSide
    workers: list[WorkerSide]
    channel: SideChannel
    kept: list[Any]

    def close(self) -> None:
        self.channel.close()


def instance_of(pair: Pair, role: str) -> Instance:
    plans = pair.source if role == "prefill" else pair.destination
    facts = pair.source_facts if role == "prefill" else pair.destination_facts
    return Instance(plans, total_kv_heads=facts.total_kv_heads, cache_dtype=facts.cache_dtype,
                    state_groups=None if facts.state_groups is None
                    else tuple(facts.state_groups),
                    **interleave_field(Instance, pair.interleave, role))


def start_side(pair: Pair, role: str, regions: dict[tuple[int, str], tuple[int, int]],
               kept: list[Any], no_copy: bool) -> Side:
    """The instance's halves, each worker's payload as `WorkerSide.register` makes it."""
    plans = pair.source if role == "prefill" else pair.destination
    facts = pair.source_facts if role == "prefill" else pair.destination_facts
    texts: list[str] = []
    channel = SideChannel("127.0.0.1", 0, lambda: texts)
    settings = Settings(instance_id=f"{role}-{uuid.uuid4().hex[:6]}",
                        side_channel_host="127.0.0.1", side_channel_port=channel.port,
                        transfer_mode="pull", lease_s=30.0, plan_request=None, facts=facts)
    workers = []
    for rank, plan in enumerate(plans):
        assert isinstance(plan, hp.KVCachePlan)
        worker = WorkerSide(plan, settings, pp_rank=0, tp_rank=rank, pp_size=1,
                            tp_size=len(plans))
        mine = [Region(name=name, base=base, size=size, mem_type="DRAM", device=0)
                for (owner, name), (base, size) in sorted(regions.items()) if owner == rank]
        agent_name = f"{settings.instance_id}-pp0-tp{rank}"
        worker.agent = Agent(agent_name, mine)
        worker.addresses = {(rank, r.name): (r.base, r.size) for r in mine}
        worker.payload = HandshakePayload(
            engine="vllm", instance_id=settings.instance_id, pp_rank=0, tp_rank=rank,
            pp_size=1, tp_size=len(plans), plan_json=plan.model_dump_json(),
            fingerprint=plan_fingerprint(plan), facts=facts, regions=mine,
            agent_name=agent_name, agent_metadata=worker.agent.metadata.hex(),
            **interleave_field(HandshakePayload, pair.interleave, role))
        if no_copy:
            worker.agent.agent = NoCopy(worker.agent.agent)
        workers.append(worker)
    texts.extend(worker.payload.model_dump_json() for worker in workers
                 if worker.payload is not None)
    assert isinstance(plans[0], hp.KVCachePlan)
    return Side(settings, SchedulerSide(plans[0], settings), workers, channel, kept)


def group_ids(plan: Plan, tokens: int) -> tuple[list[int], ...]:
    """Block ids per KV cache group, as vLLM's KVCacheBlocks.get_block_ids() hands them."""
    found = in_runs(16)(plan, tokens)
    return tuple(found[f"group.{k}"] for k in range(len(found)))


class Clock:
    """Thread CPU time and wall clock, summed per part."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    def __call__(self, part: str, work: Callable[[], Any]) -> Any:  # noqa: ANN401
        at, at_cpu = time.perf_counter(), time.thread_time()
        result = work()
        self.cpu[part] = self.cpu.get(part, 0.0) + time.thread_time() - at_cpu
        self.wall[part] = self.wall.get(part, 0.0) + time.perf_counter() - at
        return result


def one_request(prefill: Side, decode: Side, request_id: str, tokens: int,
                source_ids: tuple[list[int], ...], destination_ids: tuple[list[int], ...],
                clock: Clock) -> None:
    """One request through both instances' connector halves, in vLLM's call order."""
    finished = SimpleNamespace(name="FINISHED_LENGTH_CAPPED")
    held = SimpleNamespace(request_id=request_id, kv_transfer_params={"do_remote_decode": True},
                           status=finished, num_computed_tokens=tokens, num_prompt_tokens=tokens)
    delay, params = clock("prefill scheduler", lambda: prefill.scheduler.request_finished(
        held, source_ids))
    if not delay or params is None:
        raise SystemExit(f"{request_id}: the prefill's connector gave no ticket")
    hold = clock("prefill scheduler", prefill.scheduler.build_meta)
    # vLLM returns kv_transfer_params to the client as JSON, the proxy hands them on.
    params = json.loads(json.dumps(params))
    asked = SimpleNamespace(request_id=request_id, kv_transfer_params=params,
                            status=SimpleNamespace(name="RUNNING"), num_computed_tokens=0,
                            num_prompt_tokens=tokens)
    count, is_async = clock("decode scheduler", lambda: decode.scheduler
                            .get_num_new_matched_tokens(asked, 0))
    if not is_async or count != tokens:
        raise SystemExit(f"{request_id}: the decode's connector matched {count} tokens "
                         f"(async {is_async}); expected {tokens}, asynchronously")
    blocks = SimpleNamespace(get_block_ids=lambda: destination_ids)
    clock("decode scheduler", lambda: decode.scheduler.update_state_after_alloc(
        asked, blocks, count))
    load = clock("decode scheduler", decode.scheduler.build_meta)
    for worker in prefill.workers:
        clock("prefill workers", lambda w=worker: w.start(hold))  # type: ignore[misc]
    for worker in decode.workers:
        clock("decode workers", lambda w=worker: w.start(load))  # type: ignore[misc]
    for worker in decode.workers:
        _, recving, failing = clock("decode workers", worker.poll)
        if failing or request_id not in recving:
            raise SystemExit(f"{request_id}: the pull failed on decode worker {worker.me}; "
                             "see the log above")
    asked.status = finished
    clock("decode scheduler", lambda: decode.scheduler.request_finished(
        asked, destination_ids))
    for worker in prefill.workers:
        deadline = time.monotonic() + 10
        while True:
            sending, _, _ = clock("prefill workers", worker.poll)
            if request_id in sending:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{request_id}: prefill worker {worker.me} was never "
                                 "notified")
            time.sleep(0.002)  # the notification is on its way (untimed)


def run_pair(pair: Pair, tokens: int, repeat: int, copy_bps: tuple[float, float],
             staged: bool = True) -> float:
    """The pair's figures; returns the median CPU share of one copy (a fraction)."""
    src, dst = instance_of(pair, "prefill"), instance_of(pair, "decode")
    layout = compile_transfer(src, dst)  # regions to reserve (the connector proves its own)
    kept: list[Any] = []
    ours, kept_ours = reserved(layout.source)
    theirs, kept_theirs = reserved(layout.destination)
    kept += [kept_ours, kept_theirs]
    prefill = start_side(pair, "prefill", ours, kept, no_copy=False)
    decode = start_side(pair, "decode", theirs, kept, no_copy=True)
    try:
        source_ids = group_ids(pair.source[0], tokens)
        destination_ids = group_ids(pair.destination[0], tokens)
        request = TransferRequest(
            num_tokens=tokens, source_blocks={f"group.{k}": ids for k, ids in
                                              enumerate(source_ids)},
            destination_blocks={f"group.{k}": ids for k, ids in enumerate(destination_ids)})
        whole = layout.instantiate(request)
        moved, copies = whole.bytes, whole.chunks
        first = Clock()
        started = time.perf_counter()
        one_request(prefill, decode, "warm-up", tokens, source_ids, destination_ids, first)
        once = time.perf_counter() - started
        peering = next(iter(decode.workers[0].cache.found.values()))
        runs = []
        for index in range(repeat):
            clock = Clock()
            one_request(prefill, decode, f"req-{index}", tokens, source_ids,
                        destination_ids, clock)
            runs.append(clock)
    finally:
        prefill.close()
        decode.close()
    cpu = [sum(run.cpu.values()) for run in runs]
    wall = [sum(run.wall.values()) for run in runs]
    copy_wall, copy_cpu = moved / copy_bps[0], moved / copy_bps[1]
    median_cpu = statistics.median(cpu)
    print(f"\n### {pair.name}, {tokens:,} tokens in runs of 16 blocks "
          f"({moved / 1e9:.2f} GB in {copies:,} copies; {len(pair.source)} prefill and "
          f"{len(pair.destination)} decode workers, {len(peering.lanes)} lanes, "
          f"{len(peering.pattern.rows)} pattern rows)")
    print(f"once per pair (first request: payloads fetched, pattern compiled and proved, "
          f"lanes cut, lists prepared): {once:.2f} s")
    parts = sorted(runs[0].cpu)
    print("per request, thread CPU ms (median of "
          f"{repeat}): " + ", ".join(
              f"{part} {1e3 * statistics.median(run.cpu[part] for run in runs):.2f}"
              for part in parts))
    print(f"connector {pair.name}: {100 * median_cpu / copy_cpu:.3f}% of one copy (best "
          f"{100 * min(cpu) / copy_cpu:.3f}%; {1e3 * median_cpu:.2f} ms of CPU against the "
          f"copy's {1e3 * copy_cpu:.0f} ms)")
    print(f"  by the wall clock: {100 * statistics.median(wall) / copy_wall:.3f}% (best "
          f"{100 * min(wall) / copy_wall:.3f}%; {1e3 * statistics.median(wall):.2f} ms against "
          f"{1e3 * copy_wall:.0f} ms)", flush=True)
    if median_cpu > copy_cpu / 100 and staged:
        staged_alternative(pair, layout, request, ours, theirs, copy_wall, repeat)
    del kept
    return median_cpu / copy_cpu


def staged_alternative(pair: Pair, pattern: Any, request: TransferRequest,  # noqa: ANN401
                       ours: dict[tuple[int, str], tuple[int, int]],
                       theirs: dict[tuple[int, str], tuple[int, int]], copy_wall: float,
                       repeat: int) -> None:
    """A pair over 1%: its staged pattern per request (bench_transfer.staged_post: slots and
    rounds instantiated, each round's descriptors made), which this connector version does
    not post yet (it posts the direct pattern), and the cost model's choice."""
    from bench_transfer import staged_post
    from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint

    print("  the staged pattern of the same pair (not posted by this connector version; "
          "bench_transfer's wall-clock figures):")
    prefill = endpoint(f"staged-{uuid.uuid4().hex[:6]}", ours, progress_thread=False)
    staged_post(pair.name, pattern, request, prefill, theirs, copy_wall, repeat)


def llama(tp: int, tokens: int, *, block: int = 64,
          layout: KVCacheLayout = KVCacheLayout.BLHNC, dcp: int | None = None) -> hp.KVCachePlan:
    per_token = 80 * 8 * 128 * 2 * 2
    settings = PresetSettings(layout=layout, tp=tp, max_model_len=tokens, block_size=block,
                              dcp=dcp, gpu_mem_bytes=tokens * per_token // tp * 9 // 8)
    return hp.plan(build_request(load_preset("llama-3-70b").architecture, settings))


def deepseek_pair(tokens: int) -> tuple[Plan, Plan]:
    """bench_transfer's pattern pair, sized to the request."""
    row = 61 * 800
    prefill = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, False, kv_bytes=tokens * row * 9 // 8,
                   max_model_len=tokens)
    decode = vllm("deepseek-v3.2", KVCacheLayout.BLNHC, True, kv_bytes=tokens * 64_000 + GIB,
                  host_bytes=tokens * row * 9 // 8, max_model_len=tokens)
    return prefill, decode


def qwen3_next(tp: int, tokens: int) -> hp.KVCachePlan:
    arch = load_preset("qwen3-next-80b").architecture
    settings = PresetSettings(tp=tp, max_model_len=tokens, gpu_mem_bytes=40 * GIB // tp,
                              layout=KVCacheLayout.BLHNC)
    return hp.plan(build_request(arch, settings))


def pairs(tokens: int) -> list[Pair]:
    """The end-to-end matrix's pairs (tests/test_connector_vllm_e2e.py) at full size. Where
    the pair does not set it, the block size is vLLM 0.34's default (64), and a pair that
    changes TP runs a head-contiguous layout (BLHNC), the only kind vLLM's NixlConnector
    splits heads in; the block pair runs in both the project's default layout (BLNHC,
    token-major) and the end-to-end test's (BLHNC, head-major)."""
    lbnhc, blnhc = KVCacheLayout.LBNHC, KVCacheLayout.BLNHC
    found = [
        Pair("Llama-3-70B TP 2 -> TP 1 (BLHNC, block 64)", [llama(2, tokens)] * 2,
             [llama(1, tokens)]),
        Pair("Llama-3-70B block 16 -> 64 (BLNHC)", [llama(1, tokens, block=16, layout=blnhc)],
             [llama(1, tokens, layout=blnhc)]),
        Pair("Llama-3-70B block 16 -> 64 (BLHNC)", [llama(1, tokens, block=16)],
             [llama(1, tokens)]),
        Pair("Llama-3-70B BLHNC -> LBNHC (block 64)", [llama(1, tokens)],
             [llama(1, tokens, layout=lbnhc)]),
    ]
    prefill, decode = deepseek_pair(tokens)
    found.append(Pair("DeepSeek-V3.2 dense -> HiSparse host pool", [prefill], [decode]))
    arch = load_preset("qwen3-next-80b").architecture
    geometry = arch.state_geometry() if isinstance(arch, RegularArchitecture) else None
    if not isinstance(geometry, GatedDeltaNetGeometry):
        raise SystemExit(f"qwen3-next-80b: a Gated DeltaNet geometry expected, got {geometry}")
    groups = geometry.conv_blocks()
    facts = InstanceFacts(total_kv_heads=2, state_groups=list(groups))
    found.append(Pair("Qwen3-Next-80B (Gated DeltaNet hybrid) TP 2 -> TP 1 (BLHNC)",
                      [qwen3_next(2, tokens)] * 2, [qwen3_next(1, tokens)], facts, facts))
    found.append(Pair("Llama-3-70B TP 1 -> TP 2 DCP 2 (BLHNC, interleave 64)",
                      [llama(1, tokens)], [llama(2, tokens, dcp=2)] * 2, interleave=64))
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--repeat", type=int, default=5,
                        help="requests timed per pair, after one warm-up")
    parser.add_argument("--no-staged", action="store_true",
                        help="skip the staged alternative of pairs over 1%%")
    parser.add_argument("--pair", action="append", default=None,
                        help="only pairs whose name contains this (repeatable)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    keep_freed_heap()
    copy_bps = copy_bandwidth(max(args.repeat, 3))
    print(f"one contiguous numpy copy: {copy_bps[0] / 1e9:.2f} GB/s by the wall clock, "
          f"{copy_bps[1] / 1e9:.2f} GB/s by its CPU time ({COPY_BYTES // GIB} GiB)")
    shares = {}
    for pair in pairs(args.tokens):
        if args.pair and not any(part.lower() in pair.name.lower() for part in args.pair):
            continue
        try:
            shares[pair.name] = run_pair(pair, args.tokens, args.repeat, copy_bps,
                                         not args.no_staged)
        except TransferRefused as error:
            print(f"\n### {pair.name}\nconnector {pair.name}: refused on this tree: {error}")
    worst = max(shares.items(), key=lambda item: item[1], default=None)
    if worst is not None:
        print(f"\nworst pair: {worst[0]}, {100 * worst[1]:.3f}% of one copy (acceptance: at "
              "most 1%)")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; whole run "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
