"""Shared test settings: hypothesis is derandomized under CI (CI=true)."""

from __future__ import annotations

import os

# Test tensors are a few MiB: torch's worker threads only fight for the cores (a file of CPU
# verify runs took minutes beside other work instead of seconds). Read when torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from hypothesis import HealthCheck, settings

from hisparse_plan.cli import render
from hisparse_plan.cli.main import main
from support.cli_support import Run

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI", "").lower() == "true" else "dev")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Run:
    """Run `hisparse-plan` in-process: cli(*argv) -> (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(params=["rich", "plain"])
def renderer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Human output both ways: with rich, and as plain text (rich not installed)."""
    if request.param == "rich":
        pytest.importorskip("rich")
    else:
        monkeypatch.setattr(render, "rich_available", lambda: False)
    mode: str = request.param
    return mode
