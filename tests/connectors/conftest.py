"""A module of the connector's vLLM tests shares two long-lived role processes (a prefill
and a decode instance's), started under the Python that has vLLM (support/connector_e2e_role.py)
and ended with the module, so they take no CPU from the rest of the suite.
Where there is none they skip, except under CI (CI=true), which builds one: there its absence
is a failure."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from multiprocessing.connection import Listener

import pytest

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
