"""A role process of the connector's end-to-end test: `python -m support.connector_e2e_role
ROLE HOST PORT` connects back to the test (multiprocessing's Listener, an authkey from
$HISPARSE_PLAN_E2E_KEY), imports vLLM at once, then runs each case it is sent until None.

It runs under the Python that has vLLM 0.34, torch and nixl-cu12 (`vllm_python`): the
project's own venv when they are installed there, else `.venv-vllm` beside it (`.ci/run`
builds one), else $HISPARSE_PLAN_VLLM_PYTHON. The test's own process needs none of them."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from support import paths

Servers = dict[str, Connection]
KEY_ENV = "HISPARSE_PLAN_E2E_KEY"
PYTHON_ENV = "HISPARSE_PLAN_VLLM_PYTHON"
NEEDED = ("vllm", "torch", "nixl_cu12")


def vllm_python() -> str | None:
    """The interpreter the role processes run under, or None where there is none."""
    given = os.environ.get(PYTHON_ENV)
    if given:
        return given
    if all(importlib.util.find_spec(name) is not None for name in NEEDED):
        return sys.executable
    beside = paths.REPO / ".venv-vllm" / "bin" / "python"
    return str(beside) if beside.is_file() else None


def start(python: str, role: str, address: tuple[str, int], key: bytes
          ) -> subprocess.Popen[bytes]:
    source = str(paths.REPO / "src")
    env = {**os.environ, KEY_ENV: key.hex(), "PYTHONPATH": os.pathsep.join(
        [source, str(paths.TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([python, "-m", "support.connector_e2e_role", role, address[0],
                             str(address[1])], env=env, cwd=str(paths.REPO))


def answer(pipe: Connection, what: str) -> Any:
    """A role's next answer; its error (a traceback) fails the test naming it."""
    if not pipe.poll(300):
        raise AssertionError(f"the {what} did not answer")
    found = pipe.recv()
    if isinstance(found, tuple) and found and found[0] == "error":
        raise AssertionError(f"the {what} failed: {found[1]}")
    return found


def serve(role: str, pipe: Connection) -> None:
    from support import connector_e2e_cases as cases
    from support import connector_e2e_support  # noqa: F401  (imports vLLM)

    pipe.send("ready")
    while True:
        case = pipe.recv()
        if case is None:
            pipe.close()
            os._exit(0)  # NIXL's progress threads need not wind down one by one
        cases.ALIVE.clear()  # the case before: its notifications have landed
        if case == "release":  # nothing runs until the next case: no agent polls meanwhile
            gc.collect()
            continue
        try:
            handler = {"prefill": cases.prefill_case, "decode": cases.decode_case}[role]
            if case.get("factory"):
                pipe.send(cases.factory_facts())
            else:
                handler(case, pipe)
        except Exception as error:  # reported to the test, which fails naming it
            import traceback

            pipe.send(("error", f"{error!r}\n{traceback.format_exc()}"))


def main() -> None:
    role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pipe = Client((host, port), authkey=bytes.fromhex(os.environ[KEY_ENV]))
    pipe.send(role)
    serve(role, pipe)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
