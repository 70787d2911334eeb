"""The connector's worker half: bind and register the KV tensors, pull requests through the
proved pattern's lanes, notify the holders, hold a prefill's blocks under leases. No vLLM
import; NIXL is imported when the agent is made (`register_kv_caches`).

A pull, per request: the holder's payloads (its side channel) and this instance's (its own)
give both sides; `PatternCache` proves the pair once; each lane this worker reads is
instantiated from the ticket's and this instance's block ids and posted as one READ of its
prepared lists (made once per lane). When every lane is done, each source worker read is
notified (with how many readers it has); a source worker no lane reads is told by the first
destination worker that it has none. A refused or failed pull is reported in
`failed_recving` with all of the request's blocks invalid (vLLM's kv_load_failure_policy
decides; invalid block ids only for a single-group config, which is all vLLM can map back to
requests), and the holders are told all the same, so they free.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hisparse_plan.connectors import peering
from hisparse_plan.connectors.errors import ConnectorError
from hisparse_plan.connectors.protocol import (
    HandshakePayload,
    Region,
    Ticket,
    plan_fingerprint,
)
from hisparse_plan.connectors.transport import Agent, Leases, fetch_payloads, notification
from hisparse_plan.connectors.vllm.binding import bind_vllm_tensors
from hisparse_plan.connectors.vllm.scheduler import Load, StepMeta
from hisparse_plan.connectors.vllm.settings import Settings
from hisparse_plan.errors import PlanError
from hisparse_plan.exchange.transfer import TransferRequest
from hisparse_plan.models import KVCachePlan

LOG = logging.getLogger(__name__)


@dataclass
class Pull:
    ticket: Ticket
    source: peering.Side | None = None
    handles: list[Any] = field(default_factory=list)
    failed: bool = False
    blocks: list[int] = field(default_factory=list)
    release_only: bool = False
    """Read nothing, only let the holders free: vLLM waits for no answer (the request is
    running on a local hit, or gone), so none is reported."""
    started: float = field(default_factory=time.perf_counter)
    bytes: int = 0
    """Bytes of the lanes posted (logged with the pull's time when it completes)."""


@dataclass
class WorkerSide:
    plan: KVCachePlan
    settings: Settings
    pp_rank: int
    tp_rank: int
    pp_size: int
    tp_size: int
    dcp_size: int = 1
    cp_kv_cache_interleave_size: int = 1
    payload: HandshakePayload | None = None
    agent: Agent | None = None
    addresses: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    cache: peering.PatternCache = field(default_factory=peering.PatternCache)
    prepared: dict[tuple[object, ...], Any] = field(default_factory=dict)
    sides: dict[str, peering.Side] = field(default_factory=dict)
    pulls: dict[str, Pull] = field(default_factory=dict)
    leases: Leases = field(default_factory=Leases)
    done: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    invalid: set[int] = field(default_factory=set)

    @property
    def me(self) -> peering.Owner:
        return self.pp_rank, self.tp_rank

    def register(self, kv_caches: Mapping[str, Any]) -> HandshakePayload:
        """Bind every tensor against the plan (BindingError before anything is registered),
        then register each region once with this worker's NIXL agent."""
        bound = bind_vllm_tensors(self.plan, kv_caches)
        kinds = {pool.name: pool.location for pool in self.plan.pools}
        devices = {str(t.device) for t in kv_caches.values()}
        on_gpu = any(device.startswith("cuda") for device in devices)
        index = next((int(d.split(":")[1]) for d in devices if d.startswith("cuda:")), 0)
        regions = [Region(name=name, base=base, size=size,
                          mem_type="VRAM" if on_gpu and kinds[name] == "device" else "DRAM",
                          device=index if on_gpu and kinds[name] == "device" else 0)
                   for name, (base, size) in sorted(bound.items())]
        unique = uuid.uuid4().hex[:8]
        name = f"{self.settings.instance_id}-pp{self.pp_rank}-tp{self.tp_rank}-{unique}"
        self.agent = Agent(name, regions)
        rank = self.tp_rank
        self.addresses = {(rank, r.name): (r.base, r.size) for r in regions}
        self.payload = HandshakePayload(
            engine="vllm", instance_id=self.settings.instance_id, pp_rank=self.pp_rank,
            tp_rank=self.tp_rank, pp_size=self.pp_size, tp_size=self.tp_size,
            dcp_size=self.dcp_size,
            cp_kv_cache_interleave_size=self.cp_kv_cache_interleave_size,
            plan_json=self.plan.model_dump_json(),
            fingerprint=plan_fingerprint(self.plan), facts=self.settings.facts,
            regions=regions, agent_name=name, agent_metadata=self.agent.metadata.hex())
        return self.payload

    def side(self, address: str, refresh: bool = False) -> peering.Side:
        known = self.sides.get(address)
        if known is None or refresh:
            known = self.sides[address] = peering.side(fetch_payloads(address))
        return known

    # -- each step ---------------------------------------------------------------------
    def start(self, meta: StepMeta) -> None:
        for request_id, expires in meta.holds.items():
            self.leases.hold(request_id, expires)
        for request_id, load in meta.loads.items():
            self.start_pull(request_id, load)

    def start_pull(self, request_id: str, load: Load) -> None:
        ticket = Ticket.model_validate_json(load.ticket)
        pull = Pull(ticket, blocks=sorted({b for ids in load.blocks.values() for b in ids}),
                    release_only=load.release_only)
        self.pulls[request_id] = pull
        try:
            pull.source = self.side(ticket.side_channel)
            if load.release_only:
                return
            destination = self.side(self.settings.side_channel)
            found = self.cache.peering(pull.source, destination)
            request = TransferRequest(num_tokens=load.num_tokens,
                                      source_blocks=ticket.block_ids,
                                      destination_blocks=load.blocks)
            for lane, part in peering.mine(found, self.me, "destination").items():
                made = part.instantiate(request)
                if made.chunks:
                    pull.handles.append(self._post(lane, part, made, pull.source))
                    pull.bytes += made.bytes
        except (PlanError, ConnectorError, OSError, RuntimeError) as error:
            LOG.warning("hisparse_plan: pull of %s refused: %s", request_id, error)
            pull.failed = True

    def _post(self, lane: peering.Lane, part: Any, made: Any,  # noqa: ANN401
              source: peering.Side) -> Any:  # noqa: ANN401
        from hisparse_plan.exchange.transfer.executors import nixl_prepared
        from hisparse_plan.exchange.transfer.executors.nixl_direct import Endpoint

        if self.agent is None:
            raise ConnectorError("a pull before register_kv_caches: this worker has no NIXL "
                                 "agent yet; expected vLLM to register the KV caches first",
                                 field="agent")
        remote = source.payload(lane[0])
        key = (source.key, lane)
        prepared = self.prepared.get(key)
        local = Endpoint(self.agent.agent, self.addresses, lane[3], 0)
        if prepared is None:
            rank = peering.transfer_rank(remote)
            prepared = self.prepared[key] = nixl_prepared.prepare(
                local, remote.metadata_bytes, part, remote.addresses(rank),
                initiator="destination", local_mem_type=lane[3], remote_mem_type=lane[2],
                peer=self.agent.peer(remote))
        handle = nixl_prepared.make(local, prepared, made, notification=b"")
        state = self.agent.agent.transfer(handle)
        if state == "ERR":
            raise ConnectorError("NIXL refused to post the transfer", field="transfer")
        return handle

    def poll(self) -> tuple[set[str], set[str], set[str]]:
        """(finished sending, finished receiving, failed receiving) since the last poll."""
        recving, failing = set(), set()
        for request_id, pull in list(self.pulls.items()):
            for handle in list(pull.handles):
                agent = self.agent.agent if self.agent is not None else None
                state = "ERR" if agent is None else agent.check_xfer_state(handle)
                if state == "PROC":
                    continue
                if state != "DONE":
                    pull.failed = True
                if agent is not None:
                    agent.release_xfer_handle(handle)
                pull.handles.remove(handle)
            if pull.handles:
                continue
            self._notify(request_id, pull)
            del self.pulls[request_id]
            if pull.release_only:
                # vLLM asserts a finished_recving id is waiting for its KV or finished
                # with its blocks held for it; neither holds here.
                continue
            if pull.failed:
                failing.add(request_id)
                if len(self.plan.groups) == 1:
                    # vLLM maps invalid block ids back to requests only with one KV cache
                    # group (Scheduler._handle_invalid_blocks raises otherwise); with more,
                    # failed_recving alone says it, as NixlConnector does under HMA.
                    self.invalid.update(pull.blocks)
            else:
                recving.add(request_id)
                LOG.info("hisparse_plan: pulled %s: %d bytes in %.3f ms", request_id,
                         pull.bytes, 1e3 * (time.perf_counter() - pull.started))
        sending: set[str] = set()
        if self.agent is not None:
            for request_id, reader, readers in self.agent.notes():
                self.leases.notified(request_id, reader, readers)
        read, expired = self.leases.due(time.time())
        sending |= read | expired
        return sending, recving, failing

    def _notify(self, request_id: str, pull: Pull) -> None:
        """Tell each source worker of the request that this reader is done (module doc). A
        refused pattern is refused alike on every destination worker (one pattern per pair
        of instances), so none reads: each source worker is told it has no reader and frees
        at once rather than at its lease's end."""
        if self.agent is None or pull.source is None:
            return
        try:
            destination = self.side(self.settings.side_channel)
            try:
                found = self.cache.peering(pull.source, destination)
            except PlanError:
                for payload in pull.source.payloads:
                    self.agent.notify(payload, notification(request_id, self.me, 0))
                return
            lanes = peering.mine(found, self.me, "destination")
            sources = {lane[0] for lane in lanes}
            first = min(p.key for p in destination.payloads) == self.me
            for payload in pull.source.payloads:
                readers = found.readers[payload.key]
                if payload.key in sources or (readers == 0 and first):
                    self.agent.notify(payload, notification(request_id, self.me, readers))
        except (PlanError, ConnectorError, OSError, RuntimeError) as error:
            # Nobody to tell (a side channel or an agent gone): each holder frees on its lease.
            LOG.warning("hisparse_plan: could not notify the holders of %s: %s",
                        request_id, error)

    def take_invalid(self) -> set[int]:
        found, self.invalid = self.invalid, set()
        return found
