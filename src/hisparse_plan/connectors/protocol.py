"""What crosses between two instances' connectors: a handshake payload per rank (once per
peer) and a ticket per request (docs/connector.md#what-crosses).

Both are read from the peer as untrusted JSON (`JsonTextModel`: bounded text and depth, no
key twice, unknown keys refused) and then checked for what pydantic cannot say: a payload's
plan must be the plan its fingerprint names, its regions the regions its plan places; a
ticket's tables must be named once and its ids bounded. Lists are bounded by count before
any item is validated (`Field(max_length=...)`), so a payload of a million regions is refused
at the cost of reading it.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from hisparse_plan.connectors.engines import plan_fingerprint as plan_fingerprint
from hisparse_plan.connectors.errors import ConnectorError
from hisparse_plan.models.any_plan import Plan, load_plan
from hisparse_plan.models.base import ByteCount, PositiveInt
from hisparse_plan.models.json_model import JsonTextModel

PAYLOAD_VERSION: Final = 1
TICKET_VERSION: Final = 1
MAX_REGIONS: Final = 2**16
"""Regions a rank registers: one per pool, or per layer of SGLang's per-layer pools."""
MAX_TABLES: Final = 256
MAX_BLOCK_IDS: Final = 2**24
"""Block ids of one table of one request (16.7 M: 268 M tokens at 16 a block)."""
MAX_NAME: Final = 512
MAX_AGENT_METADATA: Final = 2**22
"""Characters of a NIXL agent's metadata, hex: 2 MiB of bytes."""
MAX_PLAN_TEXT: Final = 32 * 2**20

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
Rank = Annotated[int, Field(ge=0, le=2**20)]
BlockId = Annotated[int, Field(ge=0, le=2**62)]
Address = Annotated[int, Field(ge=0, le=2**64 - 1)]


class Region(JsonTextModel):
    """One allocation a rank registered with its transfer engine: `name` is the transfer's
    region name (`device`, `hisparse_host`, `kv/<layer>`)."""

    name: Name
    base: Address
    size: ByteCount
    mem_type: Literal["DRAM", "VRAM"]
    device: Annotated[int, Field(ge=0, le=2**16)]


class InstanceFacts(JsonTextModel):
    """What an `Instance` needs beyond its plans (`exchange.transfer.Instance`'s fields)."""

    total_kv_heads: PositiveInt | None = None
    windows: Annotated[dict[Name, PositiveInt], Field(max_length=MAX_REGIONS)] = Field(
        default_factory=dict)
    cache_dtype: Annotated[str, Field(max_length=32)] | None = None
    state_groups: Annotated[list[PositiveInt], Field(min_length=1, max_length=64)] | None = None


class HandshakePayload(JsonTextModel):
    """One rank's handshake: who it is, its plan, where its regions lie, how to reach it."""

    payload_version: Literal[1] = PAYLOAD_VERSION
    engine: Literal["vllm", "sglang"]
    instance_id: Name
    pp_rank: Rank
    tp_rank: Rank
    pp_size: PositiveInt
    tp_size: PositiveInt
    dcp_size: PositiveInt = 1
    cp_kv_cache_interleave_size: PositiveInt = 1
    """vLLM's `--cp-kv-cache-interleave-size`: tokens a DCP rank holds in a row."""
    plan_json: Annotated[str, Field(min_length=2, max_length=MAX_PLAN_TEXT)]
    fingerprint: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    facts: InstanceFacts
    regions: Annotated[list[Region], Field(max_length=MAX_REGIONS)]
    agent_name: Name
    agent_metadata: Annotated[str, Field(max_length=MAX_AGENT_METADATA,
                                         pattern=r"^([0-9a-f]{2})*$")]

    @model_validator(mode="after")
    def _consistent(self) -> HandshakePayload:
        if self.pp_rank >= self.pp_size or self.tp_rank >= self.tp_size:
            raise ConnectorError(
                f"HandshakePayload: rank (pp {self.pp_rank}, tp {self.tp_rank}) outside its "
                f"instance's (pp {self.pp_size}, tp {self.tp_size}); expected ranks below the "
                "sizes", field="tp_rank")
        names = [region.name for region in self.regions]
        if len(set(names)) != len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            raise ConnectorError(f"HandshakePayload.regions: {twice} named twice; expected "
                                 "each region once", field="regions")
        return self

    @cached_property
    def plan(self) -> Plan:
        """The rank's plan, checked against the fingerprint the payload claims for it."""
        plan = load_plan(self.plan_json)
        if plan.engine != self.engine:
            raise ConnectorError(f"HandshakePayload.plan_json: a {plan.engine} plan in a "
                                 f"{self.engine} payload; expected the engine's own plan",
                                 field="plan_json")
        found = plan_fingerprint(plan)
        if found != self.fingerprint:
            raise ConnectorError(f"HandshakePayload.fingerprint: the plan's fingerprint is "
                                 f"{found}; the payload claims {self.fingerprint}",
                                 field="fingerprint")
        return plan

    @property
    def key(self) -> tuple[int, int]:
        return self.pp_rank, self.tp_rank

    @property
    def metadata_bytes(self) -> bytes:
        return bytes.fromhex(self.agent_metadata)

    def addresses(self, rank: int) -> dict[tuple[int, str], tuple[int, int]]:
        """(rank, region) -> (base, size): what the NIXL executors take."""
        return {(rank, region.name): (region.base, region.size) for region in self.regions}


def check_regions(payload: HandshakePayload, places: dict[str, int]) -> None:
    """Every region the plan places (name -> bytes) registered once, at least that large;
    no other region: a payload that registers less than its plan moves nothing safely."""
    given = {region.name: region for region in payload.regions}
    for name, size in places.items():
        region = given.get(name)
        if region is None:
            raise ConnectorError(f"HandshakePayload.regions: the plan places region {name!r}, "
                                 "which the payload does not register; expected every region "
                                 "of the plan", field="regions")
        if region.size < size:
            raise ConnectorError(f"HandshakePayload.regions[{name!r}]: {region.size} bytes "
                                 f"registered; the plan places {size}", field="regions")
    extra = sorted(set(given) - set(places))
    if extra:
        raise ConnectorError(f"HandshakePayload.regions: {extra} are no region of the plan; "
                             f"expected only {sorted(places)}", field="regions")


class Ticket(JsonTextModel):
    """One request's KV on the instance that holds it: what a peer needs to move it. Block
    ids are per block table (`exchange.transfer.tables`), in token order, as the engine hands
    them (vLLM's sliding-window lists unclipped, null id 0 before the window)."""

    ticket_version: Literal[1] = TICKET_VERSION
    request_id: Name
    instance_id: Name
    num_tokens: PositiveInt
    block_ids: Annotated[dict[Name, Annotated[list[BlockId], Field(max_length=MAX_BLOCK_IDS)]],
                         Field(min_length=1, max_length=MAX_TABLES)]
    expires_at: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    """Seconds since the epoch (time.time()) when the holder frees the blocks unread."""
    side_channel: Annotated[str, Field(max_length=MAX_NAME,
                                       pattern=r"^(127\.0\.0\.1|localhost|\[::1\]):[0-9]{1,5}$")]
    """host:port of the holder's side channel (loopback only in this version)."""
    first_token: Annotated[int, Field(ge=0, le=2**31)] | None = None
