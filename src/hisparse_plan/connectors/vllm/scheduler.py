"""The connector's scheduler half (vLLM 0.34's call order: CONNECTORS.md 1.3), no vLLM
import: it reads vLLM's `Request` and `KVCacheBlocks` by attribute.

Prefill (`do_remote_decode`): when a request finishes, its ticket (block ids per table as
vLLM hands them) goes out in `kv_transfer_params`, and its blocks stay held until the workers
report it in `finished_sending` (every reader notified, or the lease expired). Decode
(a ticket in the params): the prompt's tokens are matched asynchronously, the blocks vLLM
allocates for them go to the workers with the ticket, and vLLM recomputes the last prompt
token itself once `finished_recving` arrives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hisparse_plan.connectors.protocol import Ticket
from hisparse_plan.connectors.vllm.settings import TICKET_KEY, Settings
from hisparse_plan.exchange.transfer import tables
from hisparse_plan.models import KVCachePlan

FINISHED_NORMALLY = frozenset({"FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED"})


@dataclass
class Load:
    """One request to pull: its ticket, this instance's blocks per table, its tokens."""

    ticket: str
    blocks: dict[str, list[int]]
    num_tokens: int
    release_only: bool = False
    """A full local hit (or an abort before the load): read nothing, let the holder free."""


@dataclass
class StepMeta:
    """What the scheduler tells the workers each step (vLLM's KVConnectorMetadata)."""

    loads: dict[str, Load] = field(default_factory=dict)
    holds: dict[str, float] = field(default_factory=dict)
    """Prefill: request -> lease expiry (time.time()) of blocks held for readers."""


class SchedulerSide:
    def __init__(self, plan: KVCachePlan, settings: Settings) -> None:
        self.plan = plan
        self.settings = settings
        self.tables = tables(plan)
        self.group_ids = tuple(sorted(int(name.split(".")[1]) for name in self.tables
                                      if name.startswith("group.")))
        self.pending = StepMeta()

    def ticket_of(self, request: Any) -> Ticket | None:  # noqa: ANN401
        params = request.kv_transfer_params or {}
        data = params.get(TICKET_KEY)
        if data is None or not params.get("do_remote_prefill"):
            return None
        return Ticket.model_validate(data)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int  # noqa: ANN401
                                   ) -> tuple[int, bool]:
        ticket = self.ticket_of(request)
        if ticket is None:
            return 0, False
        count = min(ticket.num_tokens, request.num_prompt_tokens) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any,  # noqa: ANN401
                                 num_external_tokens: int) -> None:
        ticket = self.ticket_of(request)
        if ticket is None:
            return
        ids = blocks.get_block_ids()
        local = {f"group.{k}": list(ids[k]) for k in self.group_ids if k < len(ids)}
        self.pending.loads[request.request_id] = Load(
            ticket.model_dump_json(), local,
            min(ticket.num_tokens, request.num_prompt_tokens),
            release_only=num_external_tokens == 0)
        request.kv_transfer_params["do_remote_prefill"] = False  # one transfer a request

    def build_meta(self) -> StepMeta:
        meta, self.pending = self.pending, StepMeta()
        return meta

    def request_finished(self, request: Any, block_ids: Any  # noqa: ANN401
                         ) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill") and params.get(TICKET_KEY):
            # Aborted before its blocks were allocated: the holder must still free its own.
            ticket = Ticket.model_validate(params[TICKET_KEY])
            self.pending.loads[request.request_id] = Load(ticket.model_dump_json(), {}, 0,
                                                          release_only=True)
            params["do_remote_prefill"] = False
            return False, None
        if not params.get("do_remote_decode"):
            return False, None
        if getattr(request.status, "name", str(request.status)) not in FINISHED_NORMALLY:
            return False, None  # aborted: vLLM frees the blocks now
        ids = {f"group.{k}": list(block_ids[k]) for k in self.group_ids if k < len(block_ids)}
        if not any(ids.values()):
            return False, None
        expires = time.time() + self.settings.lease_s
        num_tokens = min(request.num_computed_tokens, request.num_prompt_tokens)
        ticket = Ticket(request_id=request.request_id, instance_id=self.settings.instance_id,
                        num_tokens=num_tokens, block_ids=ids, expires_at=expires,
                        side_channel=self.settings.side_channel)
        self.pending.holds[request.request_id] = expires
        return True, {TICKET_KEY: ticket.model_dump(mode="json"), "do_remote_prefill": True,
                      "do_remote_decode": False}
