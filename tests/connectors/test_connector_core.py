"""The connectors' engine-free core: payloads and tickets read as untrusted JSON, peering
(one proved pattern cut into lanes, readers per source worker), leases, notifications and the
side channel. No vLLM, no NIXL."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from hisparse_plan.connectors import peering
from hisparse_plan.connectors.errors import ConnectorError
from hisparse_plan.connectors.protocol import HandshakePayload, Ticket, plan_fingerprint
from hisparse_plan.connectors.transport import (
    Leases,
    SideChannel,
    fetch_payloads,
    notification,
    parse_notification,
)
from hisparse_plan.errors import PlanError
from support.connector_support import MemType, payloads
from support.transfer_support import attention_layers, deepseek_plan, vllm_plan


def llama(tp: int, *, block: int = 16, layout: str = "BLHNC") -> list[Any]:
    return [vllm_plan(attention_layers(2, 4 // tp, block=block), layout=layout)] * tp


def test_a_payload_round_trips_and_its_plan_is_checked() -> None:
    payload = payloads(llama(1), "prefill")[0]
    again = HandshakePayload.model_validate_json(payload.model_dump_json())
    assert plan_fingerprint(again.plan) == payload.fingerprint
    forged = payload.model_copy(update={"fingerprint": "0" * 64})
    with pytest.raises(ConnectorError, match="fingerprint"):
        _ = forged.plan


@pytest.mark.parametrize(("change", "match"), [
    ({"tp_rank": 3}, "outside"),
    ({"agent_metadata": "xyz"}, "agent_metadata"),
    ({"engine": "trtllm"}, "engine"),
    ({"regions": [{"name": "device", "base": 0, "size": 1, "mem_type": "DRAM", "device": 0}] * 2},
     "named twice"),
    ({"regions": [{"name": "device", "base": -1, "size": 1, "mem_type": "DRAM", "device": 0}]},
     "base"),
    ({"extra": 1}, "extra"),
])
def test_hostile_payloads_are_refused(change: dict[str, Any], match: str) -> None:
    data = json.loads(payloads(llama(1), "prefill")[0].model_dump_json())
    data.update(change)
    with pytest.raises((ValidationError, PlanError), match=match):
        HandshakePayload.model_validate_json(json.dumps(data))


def test_hostile_json_text_is_refused_before_validation() -> None:
    text = payloads(llama(1), "prefill")[0].model_dump_json()
    with pytest.raises(PlanError, match=r"twice|duplicate"):
        HandshakePayload.model_validate_json(text[:-1] + ', "engine": "vllm"}')
    with pytest.raises(PlanError, match=r"deep|depth|nest"):
        HandshakePayload.model_validate_json('{"a": ' * 300 + "1" + "}" * 300)


def ticket(**change: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"request_id": "r1", "instance_id": "p", "num_tokens": 40,
                            "block_ids": {"group.0": [1, 2, 3]}, "expires_at": 1e9,
                            "side_channel": "127.0.0.1:5555"}
    data.update(change)
    return data


@pytest.mark.parametrize(("change", "match"), [
    ({"num_tokens": 0}, "num_tokens"),
    ({"block_ids": {}}, "block_ids"),
    ({"block_ids": {"group.0": [-1]}}, "block_ids"),
    ({"side_channel": "10.0.0.1:5555"}, "side_channel"),
    ({"expires_at": float("nan")}, "expires_at"),
    ({"ticket_version": 2}, "ticket_version"),
])
def test_hostile_tickets_are_refused(change: dict[str, Any], match: str) -> None:
    Ticket.model_validate_json(json.dumps(ticket()))
    with pytest.raises((ValidationError, PlanError), match=match):
        Ticket.model_validate(ticket(**change))


def test_too_many_block_ids_are_refused_by_count() -> None:
    from hisparse_plan.connectors.protocol import MAX_BLOCK_IDS

    with pytest.raises(ValidationError, match="at most"):
        Ticket.model_validate(ticket(block_ids={"group.0": [1] * (MAX_BLOCK_IDS + 1)}))


def test_tp2_prefill_into_tp1_decode_has_one_lane_per_source_worker() -> None:
    src = peering.side(payloads(llama(2), "prefill", total_kv_heads=4))
    dst = peering.side(payloads(llama(1), "decode", total_kv_heads=4, base=1 << 40))
    cache = peering.PatternCache()
    found = cache.peering(src, dst)
    assert cache.peering(src, dst) is found  # proved once per pair
    assert set(found.lanes) == {((0, 0), (0, 0), "DRAM", "DRAM"),
                                ((0, 1), (0, 0), "DRAM", "DRAM")}
    assert found.readers == {(0, 0): 1, (0, 1): 1}
    # Every row in exactly one lane.
    assert sum(len(p.rows) for p in found.lanes.values()) == len(found.pattern.rows)
    for (src_owner, _, _, _), part in found.lanes.items():
        assert {row.src_rank for row in part.rows} == {src_owner[1]}


def test_tp1_prefill_into_tp2_decode_is_read_twice() -> None:
    src = peering.side(payloads(llama(1), "prefill", total_kv_heads=4))
    dst = peering.side(payloads(llama(2), "decode", total_kv_heads=4, base=1 << 40))
    found = peering.pair(src, dst)
    assert found.readers == {(0, 0): 2}
    assert set(peering.mine(found, (0, 1), "destination")) == {
        ((0, 0), (0, 1), "DRAM", "DRAM")}


def test_a_hisparse_decode_has_a_lane_per_memory_type() -> None:
    src = peering.side(payloads([deepseek_plan(hisparse=False)], "prefill"))
    plan = deepseek_plan(hisparse=True)
    kinds: dict[str, MemType] = {pool.name: "DRAM" if pool.location == "host" else "VRAM"
                                 for pool in plan.pools}
    dst = peering.side(payloads([plan], "decode", base=1 << 40, mem_types=kinds))
    found = peering.pair(src, dst)
    assert {lane[3] for lane in found.lanes} == {"DRAM", "VRAM"}
    assert found.readers == {(0, 0): 1}


def test_a_region_the_plan_places_must_be_registered() -> None:
    given = payloads(llama(1), "decode")
    given[0] = given[0].model_copy(update={"regions": []})
    src = peering.side(payloads(llama(1), "prefill"))
    with pytest.raises(ConnectorError, match="registered by no worker"):
        peering.pair(src, peering.side(given))


def test_payloads_of_one_instance_must_be_complete() -> None:
    given = payloads(llama(2), "decode")
    with pytest.raises(ConnectorError, match="expected each of"):
        peering.side(given[:1])


def test_leases_free_on_the_last_reader_or_on_expiry() -> None:
    leases = Leases()
    leases.hold("a", expires_at=100.0)
    leases.hold("b", expires_at=100.0)
    leases.notified("a", (0, 0), 2)
    assert leases.due(50.0) == (set(), set())
    leases.notified("a", (0, 0), 2)  # the same reader twice counts once
    assert leases.due(50.0) == (set(), set())
    leases.notified("a", (0, 1), 2)
    assert leases.due(50.0) == ({"a"}, set())
    assert leases.due(100.0) == (set(), {"b"})
    assert leases.held == {}
    leases.notified("a", (0, 2), 2)  # late: "a" was let go, and vLLM must not hear of it again
    assert leases.due(200.0) == (set(), set())


def test_notifications_parse_strictly() -> None:
    note = notification("req-1", (0, 1), 2)
    assert parse_notification(note) == ("req-1", (0, 1), 2)
    for bad in (b"transfer done", b"hpc1|[1,2]", b"hpc1|" + b"x" * 2000, b"hpc1|{",
                b'hpc1|["req-1", [0, 1], 2]',
                b'hpc1|{"request": "r", "reader": [0, 1], "readers": true}',
                b'hpc1|{"request": "r", "reader": [0], "readers": 1}',
                b'hpc1|{"request": "r", "reader": [0, 1], "readers": 1, "more": 0}',
                b'hpc1|{"request": "r", "request": "s", "reader": [0, 1], "readers": 1}'):
        assert parse_notification(bad) is None


def test_the_side_channel_serves_payloads_on_loopback_only() -> None:
    texts = [payload.model_dump_json() for payload in payloads(llama(2), "prefill")]
    channel = SideChannel("127.0.0.1", 0, lambda: texts)
    try:
        got = fetch_payloads(channel.address)
        assert [payload.key for payload in got] == [(0, 0), (0, 1)]
    finally:
        channel.close()
    with pytest.raises(ConnectorError, match="loopback"):
        SideChannel("0.0.0.0", 0, lambda: texts)
    with pytest.raises(ConnectorError, match="loopback"):
        fetch_payloads("192.168.1.1:80")
