"""HisparsePlanConnector end to end on CPU, as an engine team would try it: two processes,
a prefill and a decode vLLM 0.34 instance (the real `Scheduler` on the scheduler's view of
`to_kv_cache_config(plan)`, the connector loaded by vLLM's factory by module path, its worker
halves on KV tensors from vLLM's own `allocate_kv_cache` or `hisparse_plan.torch.allocate`,
their outputs merged by vLLM's `KVOutputAggregator`), NIXL DRAM to DRAM over UCX.

The prefill's fake forward writes seeded KV (a function of layer, token, head and byte)
through its plan's views; after `finished_recving` every byte of the decode's regions is
checked: the request's against the oracle's independent geometry (vLLM's DCP slot mapping
for a DCP decode), every other byte (the canaries) unchanged, and all of them against the
reference executor on the prefill's bytes. The prefill frees the request's blocks only once
the decode has notified it (its free time is after the start of the decode step that saw the
load finish), or when its lease expires (after the ticket's expiry).

Two long-lived role processes serve every case (the `servers` fixture: they run under the
Python that has vLLM, torch and nixl-cu12, this one or `.venv-vllm`'s; without one the module
skips, except under CI=true, which builds one: there its absence is a failure); the cases are tiny
(2 layers, a few dozen blocks: support/connector_e2e_cases.py)."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from multiprocessing.connection import Listener
from typing import Any

import pytest

from support.connector_e2e_cases import PAIRS, TOKENS, llama
from support.connector_e2e_role import Servers, answer, start, vllm_python


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    python = vllm_python()
    if python is None:
        message = ("no Python with vLLM 0.34, torch and nixl-cu12: install them, or build "
                   ".venv-vllm as .ci/run does, or set HISPARSE_PLAN_VLLM_PYTHON")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    key = secrets.token_bytes(16)
    pipes: Servers = {}
    children = []
    with Listener(("127.0.0.1", 0), authkey=key) as listener:
        for role in ("prefill", "decode"):  # both import vLLM at once, side by side
            children.append(start(python, role, listener.address, key))
        for _ in children:
            pipe = listener.accept()
            pipes[str(pipe.recv())] = pipe
    for role, pipe in pipes.items():
        if answer(pipe, role) != "ready":
            raise AssertionError(f"the {role} did not start")
    yield pipes
    for pipe in pipes.values():
        pipe.send(None)
    for child in children:
        try:
            child.wait(timeout=30)
        except Exception:
            child.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_pair(servers: Servers, name: str, case: dict[str, Any], *, decode: bool = True
             ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the decode's report or None, the prefill's)."""
    case = {**case, "name": name, "prefill_port": free_port(), "decode_port": free_port()}
    servers["prefill"].send(case)
    params, source, _ = answer(servers["prefill"], "prefill")
    report = None
    try:
        if decode:
            servers["decode"].send({**case, "params": params, "source": source})
            report = answer(servers["decode"], "decode")
    finally:
        servers["prefill"].send("stop")  # a decode that failed: stop holding for it
        held = answer(servers["prefill"], "prefill")
        for pipe in servers.values():
            pipe.send("release")
    return report, held


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_a_request_moves_between_two_vllm_instances(servers: Servers, name: str) -> None:
    report, held = run_pair(servers, name, PAIRS[name])
    assert report is not None
    assert report["loaded_by"] is not None, report
    assert not report["failed"], report
    assert report["wrong_bytes"] == 0
    assert report["reference_mismatch"] == 0
    assert report["changed"] > 0
    assert report["checked_bytes"] > report["moved_bytes"] > 0
    # vLLM recomputes the last prompt token (39 loaded + 1), then samples; the request ends.
    assert report["status"] == "FINISHED_LENGTH_CAPPED"
    assert report["outputs"] == 2
    assert report["gone"]
    if PAIRS[name].get("decode_keeps") != "hisparse":
        assert report["free"] == report["total"] - 1
    else:  # HiSparse's host import: recorded at allocation, published on finished_recving
        assert report["host_import"] == ["pending", "published"]
    # Held until the decode's notification (sent in the step that saw the load finish).
    assert held["held_free"] < held["total"] - 1
    assert held["freed_at"] is not None, "the prefill never freed the request's blocks"
    assert held["freed_at"] >= report["loaded_by"]
    assert held["freed_at"] < held["expires_at"]
    assert held["free"] == held["total"] - 1


def test_a_tensor_unlike_its_plan_is_refused_at_registration(servers: Servers) -> None:
    case = {"prefill": llama(1), "tamper": True, "name": "tamper",
            "prefill_port": free_port()}
    servers["prefill"].send(case)
    found = answer(servers["prefill"], "prefill")
    layer = "model.layers.0.self_attn.attn"
    assert found["layer"] == layer, found
    # Both values: the tensor's shape (one block short) and the plan view's.
    blocks = 256 // 16 + 6
    assert f"{layer!r}" in found["refused"]
    assert f"({blocks - 1}, " in found["refused"]
    assert f"({blocks}, " in found["refused"]


REFUSED = {"prefill": llama(1), "decode": llama(1, head_size=32)}
"""Heads of 16 elements into heads of 32: no pattern moves it."""


def test_a_refused_pattern_fails_the_request_under_the_fail_policy(servers: Servers) -> None:
    report, held = run_pair(servers, "refused, fail", {**REFUSED, "policy": "fail"})
    assert report is not None
    assert report["failed"], report
    assert report["invalid"] > 0, report
    assert report["status"] == "FINISHED_ERROR"
    assert report["outputs"] == 0
    assert report["gone"]
    assert report["free"] == report["total"] - 1
    # Told it has no reader, the prefill frees before its lease ends.
    assert held["freed_at"] is not None
    assert held["freed_at"] < held["expires_at"]
    assert held["free"] == held["total"] - 1


def test_a_refused_pattern_is_recomputed_under_the_recompute_policy(servers: Servers) -> None:
    report, held = run_pair(servers, "refused, recompute", {**REFUSED, "policy": "recompute"})
    assert report is not None
    assert report["failed"], report
    assert report["status"] == "FINISHED_LENGTH_CAPPED"
    assert report["outputs"] == 2
    assert report["computed"] == TOKENS + 1  # every prompt token computed locally
    assert report["gone"]
    assert report["free"] == report["total"] - 1
    assert held["freed_at"] is not None
    assert held["free"] == held["total"] - 1


def test_a_lease_expiry_frees_the_prefills_blocks(servers: Servers) -> None:
    _, held = run_pair(servers, "lease", {"prefill": llama(1), "lease_s": 0.5}, decode=False)
    assert held["held_free"] < held["total"] - 1
    assert held["freed_at"] is not None
    assert held["freed_at"] >= held["expires_at"]
    assert held["free"] == held["total"] - 1


@pytest.mark.parametrize("when", ["before allocation", "during the load"])
def test_a_decode_abort_releases_both_sides(servers: Servers, when: str) -> None:
    pair = {"prefill": llama(1), "decode": llama(1), "abort_decode": when}
    report, held = run_pair(servers, f"abort {when}", pair)
    assert report is not None
    assert report["status"] == "FINISHED_ABORTED", report
    assert report["outputs"] == 0
    assert report["gone"]
    assert report["free"] == report["total"] - 1
    assert held["freed_at"] is not None
    assert held["freed_at"] < held["expires_at"]
    assert held["free"] == held["total"] - 1


def test_a_prefill_abort_holds_nothing(servers: Servers) -> None:
    case = {"prefill": llama(1), "abort_prefill": True, "name": "abort prefill",
            "prefill_port": free_port()}
    servers["prefill"].send(case)
    _, _, found = answer(servers["prefill"], "prefill")
    assert not found["held"]
    assert found["free"] == found["total"] - 1


# vLLM 0.34's own KVConnectorFactory, asked in the role process (the venv that has vLLM with
# the project installed): it loads the class by module path, and SupportsHMA holds (else
# vLLM switches the hybrid manager off, or refuses: factory.py::create_connector).
def test_vllms_factory_loads_the_class_by_module_path(servers: Servers) -> None:
    servers["prefill"].send({"factory": True})
    found = answer(servers["prefill"], "prefill")
    assert found["name"] == "HisparsePlanConnector"
    assert found["module"] == "hisparse_plan.connectors.vllm.connector"
    assert found["is_v1_connector"]
    assert found["supports_hma"]
    assert found["supports_hma_config"]
    assert found["layout"] is None  # any layout: the plan says
    assert found["access"] == "REGISTERS"
    assert found["wrong_name"] is not None  # a class the module lacks is vLLM's error
