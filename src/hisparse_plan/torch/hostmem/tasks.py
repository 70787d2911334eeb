"""Blocking calls on worker threads that an interrupt never strands, and step progress.

Prefaulting and CUDA registration both run many long, uninterruptible calls (a madvise or a
cudaHostRegister cannot be abandoned halfway). When the calling thread is interrupted (Ctrl-C
arrives in the main thread as KeyboardInterrupt) or one call fails, what matters is that no new
call starts and that every call already running has returned before the caller starts undoing
them: only then is the set of registered chunks, or committed pages, known exactly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

LOG = logging.getLogger("hisparse_plan.torch")
"""The backend's logger: a child of "hisparse_plan", so one handler there sees everything."""

Progress = Callable[[str, int, int], None]
"""`progress(step, done, total)`: `step` names what runs ("prefault", "register", "verify"),
`done` of `total` units of it are finished. Called from the caller's thread only."""

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Skipped(Exception):
    """A call that had not started when the batch was stopped."""


def run_tasks(
    items: Sequence[Item],
    work: Callable[[Item], Result],
    *,
    threads: int,
    step: str,
    progress: Progress | None = None,
) -> list[Result]:
    """`work(item)` for every item, `threads` at a time; the results in item order.

    `progress(step, done, total)` is called before the first call and after each one returns.
    If a call raises, or the calling thread is interrupted (any BaseException), no further
    call starts, the calls already running are waited for, and the exception propagates. A
    second KeyboardInterrupt while waiting is absorbed: the first one is already on its way.
    """
    total = len(items)
    report: Progress = progress if progress is not None else _silent
    report(step, 0, total)
    if threads <= 1 or total <= 1:
        results = []
        for done, item in enumerate(items, start=1):
            results.append(work(item))
            report(step, done, total)
        return results
    batch = _Batch()
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"hisparse-{step}")
    futures: list[Future[Result]] = []
    try:
        futures.extend(executor.submit(batch.run, work, item) for item in items)
        pending: set[Future[Result]] = set(futures)
        done = 0
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                future.result()  # the first failure stops the batch
                done += 1
                report(step, done, total)
    except BaseException:
        batch.stop()
        for future in futures:
            future.cancel()
        batch.wait_idle()
        _drain(executor)
        raise
    executor.shutdown(wait=True)
    return [future.result() for future in futures]


class _Batch:
    """Counts the calls running now, and once stopped lets no new one start. The count, not
    the executor's threads, is what is waited for: an interrupt can land inside `submit`
    after a worker thread started but before the executor recorded it."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._running = 0
        self._stopped = False

    def run(self, work: Callable[[Item], Result], item: Item) -> Result:
        with self._condition:
            if self._stopped:
                raise _Skipped
            self._running += 1
        try:
            return work(item)
        finally:
            with self._condition:
                self._running -= 1
                self._condition.notify_all()

    def stop(self) -> None:
        with self._condition:
            self._stopped = True

    def wait_idle(self) -> None:
        """Until no call runs, whatever interrupts the wait (the first interrupt is already
        on its way; the calls cannot be abandoned)."""
        while True:
            try:
                with self._condition:
                    self._condition.wait_for(lambda: self._running == 0)
            except KeyboardInterrupt:
                LOG.debug("interrupted again while waiting for running calls; still waiting")
                continue
            return


def _drain(executor: ThreadPoolExecutor) -> None:
    """Let the (now idle) worker threads go, whatever interrupts the wait."""
    while True:
        try:
            executor.shutdown(wait=True, cancel_futures=True)
        except KeyboardInterrupt:
            continue
        return


def _silent(step: str, done: int, total: int) -> None:
    return None
