"""HisparsePlanConnector end to end on CPU, as an engine team would try it: two processes,
a prefill and a decode vLLM 0.34 instance (the real `Scheduler` on `to_kv_cache_config(plan)`,
the connector loaded by vLLM's factory by module path, its worker halves on KV tensors from
vLLM's own `allocate_kv_cache` or `hisparse_plan.torch.allocate`), NIXL DRAM to DRAM over
UCX. The prefill's fake forward writes seeded KV (a function of layer, token, head and
byte) through its plan's views; after `finished_recving` every byte of the decode's regions
is checked: the request's against the oracle's independent geometry, every other byte (the
canaries) unchanged, and all of them against the reference executor on the prefill's bytes.
The prefill frees the request's blocks only once the decode has notified it.

Runs where vLLM, torch and nixl-cu12 import (the vLLM venv; `.ci/run` runs it there)."""

from __future__ import annotations

import multiprocessing
import socket
from multiprocessing.connection import Connection
from typing import Any

import pytest

pytest.importorskip("vllm")
pytest.importorskip("nixl_cu12")
pytest.importorskip("torch")

from support.transfer_support import attention_layers, vllm_request

TOKENS = 40
ALIVE: list[Any] = []
"""Each case's instances stay alive in their process, as a serving engine's would: a NIXL
agent collected at once could drop a notification still on its way."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def llama(tp: int, *, block: int = 16, layout: str = "BLHNC") -> dict[str, Any]:
    request = vllm_request(attention_layers(2, 4 // tp, block=block), layout=layout,
                           max_model_len=256)
    request["device"]["num_blocks_override"] = 256 // block + 6
    return request


def serve(role: str, pipe: Connection) -> None:
    """One long-lived process per role (vLLM imports once): runs each case it is sent."""
    while True:
        case = pipe.recv()
        if case is None:
            return
        try:
            (prefill_case if role == "prefill" else decode_case)(case, pipe)
        except Exception as error:
            import traceback

            pipe.send(("error", f"{error!r}\n{traceback.format_exc()}"))


def prefill_case(case: dict[str, Any], pipe: Connection) -> None:
    import time

    from support import connector_e2e_support as e2e
    from hisparse_plan.connectors import peering
    from support.transfer_support import write

    port = case["prefill_port"]
    instance = e2e.start(case["prefill"], tp=case["prefill_tp"], port=port,
                         instance="prefill", memory=case["memory"],
                         lease_s=case.get("lease_s", 30.0))
    request = e2e.new_request("req-0", TOKENS, {"do_remote_decode": True}, max_tokens=1)
    instance.scheduler.add_request(request)
    params = None
    while params is None:
        _, engine = instance.step()
        for found in engine.values():
            for output in found.outputs:
                if output.kv_transfer_params:
                    params = output.kv_transfer_params
    ticket = params["hisparse_plan_ticket"]
    # The fake forward: seeded KV of the request's tokens through the prefill plan's views.
    payloads = [w.worker_side.payload for w in instance.workers]
    side = peering.side(payloads)
    names = sorted(side.instance.facts[0].layers)
    live: dict[tuple[int, str], Any] = {}
    for rank in range(case["prefill_tp"]):
        live.update(instance.regions(rank))
    write(side.instance, ticket["block_ids"], live, {n: i for i, n in enumerate(names)},
          {name: (0, 2**40) for name in names})
    pool = instance.scheduler.kv_cache_manager.block_pool
    pipe.send((params, {key: value.tobytes() for key, value in live.items()}))
    held = []
    freed_at = None
    asked_at = time.monotonic()
    deadline = time.monotonic() + 120
    asked = False
    while time.monotonic() < deadline:
        asked = asked or (pipe.poll(0.001) and pipe.recv() == "report")
        _, _ = instance.step()
        held.append(pool.get_num_free_blocks())
        if freed_at is None and "req-0" not in instance.scheduler.requests:
            freed_at = len(held)
        # Asked once the decode is done: the notification may still be on its way.
        if asked and (freed_at is not None or time.monotonic() > asked_at + 20):
            break
        if not asked:
            asked_at = time.monotonic()
    pipe.send((held, freed_at, pool.num_gpu_blocks))
    ALIVE.append(instance)


def decode_case(case: dict[str, Any], pipe: Connection) -> None:
    import time

    from support import connector_e2e_support as e2e
    from hisparse_plan.connectors import peering
    from hisparse_plan.connectors.transport import fetch_payloads
    from hisparse_plan.exchange.transfer import TransferRequest, compile_transfer
    from hisparse_plan.exchange.transfer.executors.reference import buffers, execute
    from support.transfer_support import oracle, wrong_bytes

    params, source_bytes = case["params"], case["source"]
    instance = e2e.start(case["decode"], tp=case["decode_tp"], port=case["decode_port"],
                         instance="decode", memory=case["memory"])
    ticket = params["hisparse_plan_ticket"]
    src = peering.side(fetch_payloads(ticket["side_channel"]))
    dst = peering.side([w.worker_side.payload for w in instance.workers])
    live: dict[tuple[int, str], Any] = {}
    for rank in range(case["decode_tp"]):
        live.update(instance.regions(rank))
    # Canaries: every byte of the decode's regions random before the pull (seed 2).
    pattern = compile_transfer(src.instance, dst.instance)
    start = buffers(pattern.destination, fill=None, seed=2)
    for key, value in start.items():
        live[key][: value.size] = value
    request = e2e.new_request("req-0", TOKENS, dict(params), max_tokens=4)
    instance.scheduler.add_request(request)
    report: dict[str, Any] = {"finished_recving": False, "failed": False}
    blocks: dict[str, list[int]] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.001)
        out, _ = instance.step()
        for new in out.scheduled_new_reqs:
            blocks = {f"group.{k}": list(ids) for k, ids in enumerate(new.block_ids)}
        if instance.scheduler.failed_recving_kv_req_ids or (
                request.status.name == "FINISHED_ERROR"):
            report["failed"] = True
        if request.num_output_tokens > 0 or request.is_finished():
            break
    report["finished_recving"] = request.num_output_tokens > 0
    report["recomputed"] = request.num_computed_tokens
    if report["finished_recving"] and not case.get("expect_failure"):
        grants = instance.scheduler.kv_cache_manager.get_block_ids(request.request_id)
        blocks = {f"group.{k}": list(ids) for k, ids in enumerate(grants)}
        transfer = TransferRequest(num_tokens=TOKENS, source_blocks=ticket["block_ids"],
                                   destination_blocks={k: v for k, v in blocks.items()
                                                       if k in ticket["block_ids"]})
        made = pattern.instantiate(transfer)
        program = made.program()
        _, _, expected, allowed = oracle(src.instance, dst.instance, transfer, program)
        after = {key: live[key][: value.size].copy() for key, value in start.items()}
        report["wrong_bytes"] = wrong_bytes(after, expected, allowed)
        # The reference executor on the prefill's bytes: every byte of every region.
        import numpy as np

        source = {key: np.frombuffer(value, dtype=np.uint8).copy()
                  for key, value in source_bytes.items()}
        reference = {key: value.copy() for key, value in start.items()}
        execute(program, source, reference)
        report["reference_mismatch"] = sum(int((after[k] != reference[k]).sum())
                                           for k in after)
        report["moved_bytes"] = program.bytes
        report["changed"] = sum(int((after[k] != start[k]).sum()) for k in after)
    ALIVE.append(instance)
    pipe.send(report)


@pytest.fixture(scope="module")
def servers() -> Any:
    context = multiprocessing.get_context("spawn")
    pipes, children = {}, []
    for role in ("prefill", "decode"):
        ours, theirs = context.Pipe()
        child = context.Process(target=serve, args=(role, theirs), daemon=True)
        child.start()
        pipes[role] = ours
        children.append(child)
    yield pipes
    for pipe in pipes.values():
        pipe.send(None)
    for child in children:
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()


def answer(pipe: Connection, what: str) -> Any:
    if not pipe.poll(180):
        raise AssertionError(f"the {what} did not answer")
    found = pipe.recv()
    if isinstance(found, tuple) and found and found[0] == "error":
        raise AssertionError(f"the {what} failed: {found[1]}")
    return found


def run_pair(servers: dict[str, Connection], case: dict[str, Any]
             ) -> tuple[dict[str, Any], Any]:
    case = {**case, "prefill_port": free_port(), "decode_port": free_port()}
    servers["prefill"].send(case)
    params, source = answer(servers["prefill"], "prefill")
    servers["decode"].send({**case, "params": params, "source": source})
    report = answer(servers["decode"], "decode")
    if case.get("wait_s"):
        import time

        time.sleep(case["wait_s"])
    servers["prefill"].send("report")
    held = answer(servers["prefill"], "prefill")
    return report, held


MATRIX = {
    "llama tp2 -> tp1": {"prefill": llama(2), "decode": llama(1), "prefill_tp": 2,
                         "decode_tp": 1},
    "block 16 -> 64": {"prefill": llama(1, block=16), "decode": llama(1, block=64),
                       "prefill_tp": 1, "decode_tp": 1},
    "BLHNC -> LBNHC": {"prefill": llama(1, layout="BLHNC"), "decode": llama(1, layout="LBNHC"),
                       "prefill_tp": 1, "decode_tp": 1},
}


@pytest.mark.parametrize("memory", ["vllm", "hisparse_plan"])
@pytest.mark.parametrize("name", sorted(MATRIX))
def test_a_request_moves_between_two_vllm_instances(servers: Any, name: str, memory: str
                                                    ) -> None:
    report, held = run_pair(servers, {**MATRIX[name], "memory": memory})
    assert report["finished_recving"], report
    assert not report["failed"], report
    assert report["wrong_bytes"] == 0
    assert report["reference_mismatch"] == 0
    assert report["changed"] > 0
    # vLLM recomputes the last prompt token: 39 loaded + 1 scheduled, then one sampled.
    assert report["recomputed"] == TOKENS
    assert held is not None
    free_counts, freed_at, total = held
    assert freed_at is not None, "the prefill never freed the request's blocks"
    # Held (3 blocks of 16 tokens, or fewer of 64) until the decode's notification, then free.
    assert free_counts[0] < total - 1
    assert free_counts[-1] == total - 1
