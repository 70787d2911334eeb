"""What the backend says while it works: allocation steps logged at DEBUG on the
"hisparse_plan" logger, nothing printed, and progress(step, done, total) for a bar."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch import allocate, verify
from support.torch_support import FakeRegistrar, small_plan

Step = tuple[str, int, int]


def steps_of(seen: list[Step], step: str) -> list[tuple[int, int]]:
    return [(done, total) for name, done, total in seen if name == step]


def check_counts(counts: list[tuple[int, int]]) -> None:
    """From 0 to the total, one at a time."""
    assert counts
    total = counts[0][1]
    assert counts == [(done, total) for done in range(total + 1)]


@pytest.mark.parametrize("threads", [1, 3])
def test_allocate_reports_prefault_and_register(threads: int) -> None:
    seen: list[Step] = []
    with allocate(small_plan(), device="cpu", pin=True, registrar=FakeRegistrar(),
                  register_chunk_bytes=4 * 2**20, prefault_threads=threads,
                  progress=lambda *step: seen.append(step)) as pools:
        chunks = len(pools.chunks)
    names = [name for name, _, _ in seen]
    assert set(names) == {"prefault", "register"}
    assert names.index("register") > len(names) - 1 - names[::-1].index("prefault")
    check_counts(steps_of(seen, "prefault"))
    check_counts(steps_of(seen, "register"))
    assert steps_of(seen, "register")[-1] == (chunks, chunks)


def test_verify_reports_its_step() -> None:
    seen: list[Step] = []
    plan = small_plan()
    with allocate(plan, device="cpu", pin=False) as pools:
        verify(plan, pools, blocks=4, progress=lambda *step: seen.append(step))
    assert {name for name, _, _ in seen} == {"verify"}
    check_counts(steps_of(seen, "verify"))


def test_allocation_steps_are_logged_and_nothing_is_printed(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = small_plan()  # planning logs too (its own INFO line), before the capture starts
    with caplog.at_level(logging.DEBUG, logger="hisparse_plan"), \
            allocate(plan, device="cpu", pin=True, registrar=FakeRegistrar(),
                     register_chunk_bytes=4 * 2**20, prefault_threads=2):
        pass
    assert capsys.readouterr() == ("", "")
    assert {record.name for record in caplog.records} == {"hisparse_plan.torch"}
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    for expected in ("mapped the host pool", "host pool NUMA placement", "prefaulting",
                     "registered host pool chunk 0"):
        assert any(expected in message for message in debug), expected
    [info] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info.startswith("allocated: host pool: ")
    assert "pinned in " in info
    assert "NUMA node: unknown/not bound" in info


def test_a_long_verify_logs_its_passes_without_a_progress_callback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hisparse_plan.torch.vllm import verification

    monkeypatch.setattr(verification, "LOG_EVERY_S", 0.0)  # every pass counts as long
    plan = small_plan()
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools, \
            caplog.at_level(logging.INFO, logger="hisparse_plan.torch"):
        verify(plan, pools)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("verify:")]
    total = len(plan.groups) + 2  # every group, and a block-id pass per pool
    assert len(lines) == total
    assert lines[0].startswith(f"verify: 1 of {total} passes done (block ids of the host pool)")
    assert lines[-1].startswith(f"verify: {total} of {total} passes done (group ")
