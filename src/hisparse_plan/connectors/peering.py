"""Once per pair of instances: the pattern compiled and proved, cached by the pair of
fingerprints, and cut for the processes that post it (docs/connector.md#peering).

Each side is the handshake payloads of its ranks. A *transfer rank* is what a pattern names:
a vLLM instance's tensor-parallel rank (its plan holds every pipeline stage, a device pool
each: stage k's worker registers region `device.k`), an SGLang instance's `pp * tp + tp`
(one plan per pipeline rank). Every region of a transfer rank is registered by exactly one
worker, its *owner* `(pp, tp)`.

A *lane* is what one NIXL post can carry: the rows between one owner on each side whose
regions are one memory type on each side (a NIXL list holds one memory type; a HiSparse
decode is DRAM host pages and VRAM index keys). Each lane is a sub-pattern of the proved
pattern (its rows, all its tables), so a lane's instantiation is a subset of the proved
request's rows; together the lanes are every row, once. `readers` says, per source owner,
how many destination owners read it: the notifications a prefill worker waits for before
it lets a request's blocks go.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hisparse_plan.connectors import engines
from hisparse_plan.connectors.errors import ConnectorError
from hisparse_plan.connectors.protocol import HandshakePayload, check_regions
from hisparse_plan.exchange.transfer import (
    LOOPBACK,
    Choice,
    Instance,
    LinkCosts,
    TransferPattern,
    TransferRefused,
    check_pattern,
    choose,
    compile_staged,
    compile_transfer,
)
from hisparse_plan.models.any_plan import Plan

Owner = tuple[int, int]
"""A worker: (pp_rank, tp_rank)."""
Lane = tuple[Owner, Owner, str, str]
"""(source owner, destination owner, source memory type, destination memory type)."""


def transfer_rank(payload: HandshakePayload) -> int:
    """The rank a pattern names for this worker's regions (module doc)."""
    return engines.transfer_rank(payload.engine, payload.pp_rank, payload.tp_rank,
                                 payload.tp_size)


@dataclass(frozen=True)
class Side:
    """One instance as its workers' payloads describe it."""

    payloads: tuple[HandshakePayload, ...]
    instance: Instance
    owners: Mapping[tuple[int, str], HandshakePayload]
    """(transfer rank, region) -> the worker that registered it."""

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(payload.fingerprint for payload in self.payloads)

    def payload(self, owner: Owner) -> HandshakePayload:
        for payload in self.payloads:
            if payload.key == owner:
                return payload
        raise ConnectorError(f"no payload of worker (pp, tp) {owner}", field="payloads")


def side(payloads: Sequence[HandshakePayload]) -> Side:
    """An instance from all its workers' payloads: one per (pp, tp), one engine, one
    instance id, one set of facts; a vLLM instance's stages one plan."""
    if not payloads:
        raise ConnectorError("payloads: expected one per worker, got none", field="payloads")
    first = payloads[0]
    ordered = tuple(sorted(payloads, key=lambda p: p.key))
    keys = [payload.key for payload in ordered]
    wanted = [(pp, tp) for pp in range(first.pp_size) for tp in range(first.tp_size)]
    if keys != wanted:
        raise ConnectorError(f"payloads: workers {keys}; expected each of {wanted} once",
                             field="payloads")
    for payload in ordered:
        for what in ("engine", "instance_id", "pp_size", "tp_size", "dcp_size",
                     "cp_kv_cache_interleave_size", "facts"):
            if getattr(payload, what) != getattr(first, what):
                raise ConnectorError(
                    f"payloads: worker {payload.key} has {what} {getattr(payload, what)!r}, "
                    f"worker {first.key} {getattr(first, what)!r}; expected one instance",
                    field=what)
    plans: dict[int, Plan] = {}
    fingerprints: dict[int, str] = {}
    owners: dict[tuple[int, str], HandshakePayload] = {}
    for payload in ordered:
        rank = transfer_rank(payload)
        if rank in plans:
            if payload.fingerprint != fingerprints[rank]:
                raise ConnectorError(f"payloads: worker {payload.key}'s plan differs from "
                                     "stage 0's; expected one vLLM plan per tensor-parallel "
                                     "rank (it holds every stage)", field="plan_json")
        else:
            plans[rank], fingerprints[rank] = payload.plan, payload.fingerprint
        for region in payload.regions:
            taken = owners.setdefault((rank, region.name), payload)
            if taken is not payload:
                raise ConnectorError(f"payloads: region {region.name!r} of rank {rank} is "
                                     f"registered by workers {taken.key} and {payload.key}; "
                                     "expected one owner", field="regions")
    facts = first.facts
    instance = Instance(tuple(plans[rank] for rank in sorted(plans)),
                        total_kv_heads=facts.total_kv_heads, windows=dict(facts.windows),
                        cache_dtype=facts.cache_dtype,
                        state_groups=None if facts.state_groups is None
                        else tuple(facts.state_groups),
                        cp_kv_cache_interleave_size=first.cp_kv_cache_interleave_size)
    return Side(ordered, instance, owners)


@dataclass(frozen=True)
class Peering:
    """A proved pattern between two instances, and its lanes."""

    pattern: TransferPattern
    lanes: Mapping[Lane, TransferPattern]
    readers: Mapping[Owner, int]
    """Source worker -> destination workers that read from it (0: none)."""
    choice: Choice | None
    """The cost model's verdict (direct or staged) for the link; this version posts direct."""


@dataclass
class PatternCache:
    """Proved pairings by the pair of instances' fingerprints (and their facts)."""

    costs: LinkCosts = LOOPBACK
    found: dict[tuple[object, ...], Peering] = field(default_factory=dict)

    def peering(self, source: Side, destination: Side) -> Peering:
        key = (source.key, destination.key, source.payloads[0].facts.model_dump_json(),
               destination.payloads[0].facts.model_dump_json())
        known = self.found.get(key)
        if known is None:
            known = self.found[key] = pair(source, destination, self.costs)
        return known


def pair(source: Side, destination: Side, costs: LinkCosts = LOOPBACK) -> Peering:
    """Compile and prove the pattern (TransferRefused / TransferCheckError name what is
    refused), check every region it names is registered, cut its lanes."""
    pattern = compile_transfer(source.instance, destination.instance)
    check_pattern(pattern, source.instance, destination.instance)
    for name, which, ranks in (("source", source, pattern.source),
                               ("destination", destination, pattern.destination)):
        for rank in ranks:
            for region in rank.regions:
                if (rank.rank, region.name) not in which.owners:
                    raise ConnectorError(
                        f"{name} rank {rank.rank}: region {region.name!r} is registered by no "
                        "worker; expected every region of the plan", field="regions")
        for payload in which.payloads:
            mine = {region.name: region.size for rank in ranks
                    if rank.rank == transfer_rank(payload) for region in rank.regions
                    if which.owners[(rank.rank, region.name)] is payload}
            check_regions(payload, mine)
    try:
        choice: Choice | None = choose(compile_staged(pattern, 16), costs)
    except TransferRefused:  # a pattern staging cannot take is posted direct
        choice = None
    lanes = cut(pattern, source, destination)
    readers: dict[Owner, set[Owner]] = {p.key: set() for p in source.payloads}
    for src, dst, _, _ in lanes:
        readers[src].add(dst)
    return Peering(pattern, lanes, {owner: len(found) for owner, found in readers.items()},
                   choice)


def cut(pattern: TransferPattern, source: Side, destination: Side
        ) -> dict[Lane, TransferPattern]:
    """The pattern's rows per lane (module doc), each a pattern of its own."""
    rows: dict[Lane, list[int]] = {}
    for index, row in enumerate(pattern.rows):
        src = source.owners[(row.src_rank, row.src_region)]
        dst = destination.owners[(row.dst_rank, row.dst_region)]
        lane = (src.key, dst.key, memory(src, row.src_region), memory(dst, row.dst_region))
        rows.setdefault(lane, []).append(index)
    data = pattern.model_dump()
    dumped = data["rows"]
    found = {}
    for lane, indices in rows.items():
        found[lane] = TransferPattern.model_validate({**data,
                                                     "rows": [dumped[i] for i in indices]})
    return found


def memory(payload: HandshakePayload, region: str) -> str:
    for found in payload.regions:
        if found.name == region:
            return found.mem_type
    raise ConnectorError(f"worker {payload.key}: no region {region!r}", field="regions")


def mine(peering: Peering, owner: Owner, role: Literal["source", "destination"]
         ) -> dict[Lane, TransferPattern]:
    """The lanes a worker posts (pull: the destination's; push: the source's)."""
    at = 0 if role == "source" else 1
    return {lane: part for lane, part in peering.lanes.items() if lane[at] == owner}
