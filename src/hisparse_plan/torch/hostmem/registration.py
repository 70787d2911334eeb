"""Pinning the host pool: register it with CUDA chunk by chunk, all or nothing.

The registrar is a small protocol so the all-or-nothing logic runs, and is tested, without a
GPU; `CudaRegistrar` is the real one.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from hisparse_plan.torch.errors import RegistrationError
from hisparse_plan.torch.hostmem.chunks import Chunk
from hisparse_plan.torch.hostmem.ram import gib
from hisparse_plan.torch.hostmem.tasks import LOG, Progress, run_tasks

CUDA_HOST_REGISTER_PORTABLE = 1
"""Pinned for every CUDA context, so any device of the process can copy from the pool."""


_cudart: Callable[[], Any] = torch.cuda.cudart
"""torch's libcudart bindings (untyped in torch's stubs)."""


class Registrar(Protocol):
    """Registers host memory; each call returns 0 or an error code `describe` explains."""

    def register(self, address: int, nbytes: int) -> int: ...

    def unregister(self, address: int) -> int: ...

    def describe(self, code: int) -> str: ...


class CudaRegistrar:
    """cudaHostRegister / cudaHostUnregister through torch's bindings, on one device."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index

    def register(self, address: int, nbytes: int) -> int:
        # Worker threads start on device 0; without the guard each one would open a context
        # there, costing hundreds of MiB on a GPU that another rank owns.
        with torch.cuda.device(self.device_index):
            return _consumed(
                int(_cudart().cudaHostRegister(address, nbytes, CUDA_HOST_REGISTER_PORTABLE))
            )

    def unregister(self, address: int) -> int:
        with torch.cuda.device(self.device_index):
            return _consumed(int(_cudart().cudaHostUnregister(address)))

    def describe(self, code: int) -> str:
        cudart = _cudart()
        try:
            text = str(cudart.cudaGetErrorString(cudart.cudaError(code)))
        except (TypeError, ValueError, RuntimeError):
            text = "unknown CUDA error"
        return f"{text} (cudaError {code})"


def _consumed(code: int) -> int:
    """`code`, after taking a failure off the runtime's per-thread "last error".

    The runtime keeps a failed call's code until someone reads it, and torch reads it after
    its next allocation or kernel launch: a failure we answered (a rollback, a refusal) would
    otherwise surface in the engine's next, unrelated CUDA call. Seen on an H200: torch.empty
    on the GPU raised cudaErrorHostMemoryAlreadyRegistered after a handled failed register.
    """
    if code != 0:
        _clear_last_error()
    return code


def _clear_last_error() -> None:
    # torch's bindings have no cudaGetLastError, so it is called in the runtime library torch
    # loaded: the one whose per-thread state torch's own calls read.
    runtime = _loaded_runtime()
    if runtime is None:
        LOG.warning("could not clear the CUDA runtime's last error after a failed host "
                    "registration call: no libcudart is mapped in this process")
        return
    runtime.cudaGetLastError()


@functools.cache
def _loaded_runtime() -> ctypes.CDLL | None:
    """The libcudart this process has mapped (torch's), or None (a static or absent one)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and "/libcudart.so" in fields[5]:
            return ctypes.CDLL(fields[5])
    return None


_RAISED = -1
"""Stands for a registrar call that raised instead of returning a code."""


@dataclass(frozen=True, slots=True)
class _Outcome:
    code: int
    why: str


def _call(registrar: Registrar, register: bool, address: int, nbytes: int = 0) -> _Outcome:
    # A call that raises must not lose track of the chunks that did register, so every
    # failure, coded or raised, becomes an outcome the rollback can act on.
    try:
        code = registrar.register(address, nbytes) if register else registrar.unregister(address)
    except Exception as error:
        return _Outcome(_RAISED, f"{type(error).__name__}: {error}")
    return _Outcome(code, "" if code == 0 else registrar.describe(code))


class _ChunkFailed(Exception):
    def __init__(self, chunk: Chunk, outcome: _Outcome) -> None:
        super().__init__(chunk.index)
        self.chunk = chunk
        self.outcome = outcome


@dataclass
class Registration:
    """What of one buffer is registered now, kept exact whatever interrupts the work.

    `chunks` are registered for certain. `in_flight` are chunks whose register call started
    and gave no clear answer (it raised, or an interrupt landed between its return and the
    bookkeeping): they may or may not be registered, so undoing tries them too and accepts a
    coded failure ("not registered") as the answer. `stranded` are chunks an unregister call failed
    for. `clean` is True when all three are empty, the only state in which the buffer may be
    unmapped.
    """

    base: int
    registrar: Registrar
    chunks: list[Chunk] = field(default_factory=list)
    in_flight: set[Chunk] = field(default_factory=set)
    stranded: list[Chunk] = field(default_factory=list)
    """Chunks whose unregister call failed: the driver may still reach their pages."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def clean(self) -> bool:
        return not (self.chunks or self.in_flight or self.stranded)

    def register(
        self, chunks: Sequence[Chunk], *, threads: int = 1, progress: Progress | None = None
    ) -> None:
        """Register every chunk, `threads` at a time. On a failed call, or any exception or
        interrupt, everything registered so far is unregistered before the error propagates
        (a failed call as `RegistrationError`, naming the first chunk that failed)."""

        def attempt(chunk: Chunk) -> None:
            with self._lock:
                self.in_flight.add(chunk)
            outcome = _call(self.registrar, True, self.base + chunk.start, chunk.nbytes)
            with self._lock:
                # Recorded before it leaves in_flight: an interrupt between the two steps
                # must find the chunk in one list or the other. A call that raised may have
                # registered the chunk before raising, so that one stays in flight.
                if outcome.code == 0:
                    self.chunks.append(chunk)
                if outcome.code != _RAISED:
                    self.in_flight.discard(chunk)
            if outcome.code != 0:
                raise _ChunkFailed(chunk, outcome)
            LOG.debug("registered host pool chunk %d (bytes %d..%d)",
                      chunk.index, chunk.start, chunk.end)

        try:
            run_tasks(chunks, attempt, threads=threads, step="register", progress=progress)
        except _ChunkFailed as failed:
            chunk, outcome = failed.chunk, failed.outcome
            registered = len(self.chunks) + len(self.in_flight)
            try:
                self.unregister()
                undo = f"rolled back the {registered} chunk(s) that had registered"
            except RegistrationError as error:
                undo = f"and rolling back the {registered} registered chunk(s) failed too: {error}"
            raise RegistrationError(
                f"cudaHostRegister of host pool chunk {chunk.index} (bytes {chunk.start}.."
                f"{chunk.end}, {gib(chunk.nbytes)}) failed: {outcome.why}; {undo}",
                chunk=chunk.index,
                code=outcome.code,
            ) from None
        except BaseException as error:
            try:
                self.unregister()
            except RegistrationError as undo:
                error.add_note(f"rolling back the host pool registration failed: {undo}")
            raise

    def unregister(self) -> None:
        """Unregister every chunk, last first, then the in-flight ones; raise once at the end
        if a chunk known to be registered could not be unregistered. An interrupt meanwhile
        does not stop the others: it is raised once they are all done."""
        failures: list[str] = []
        interrupted: BaseException | None = None
        while self.chunks:
            chunk = self.chunks[-1]
            try:
                outcome = _call(self.registrar, False, self.base + chunk.start)
            except BaseException as error:  # the call's outcome is unknown: retry it below
                interrupted = interrupted or error
                self.in_flight.add(self.chunks.pop())
                continue
            self.chunks.pop()
            if outcome.code != 0:
                failures.append(f"chunk {chunk.index}: {outcome.why}")
                self.stranded.append(chunk)
        for chunk in sorted(self.in_flight, key=lambda c: c.index, reverse=True):
            try:
                outcome = _call(self.registrar, False, self.base + chunk.start)
            except BaseException as error:
                interrupted = interrupted or error
                outcome = _Outcome(_RAISED, f"{type(error).__name__} while unregistering")
            self.in_flight.discard(chunk)
            # A coded failure is the driver's answer ("not registered": the register call had
            # not got that far). No answer at all leaves the chunk possibly registered.
            if outcome.code == _RAISED:
                failures.append(f"chunk {chunk.index}: {outcome.why}")
                self.stranded.append(chunk)
        if failures:
            failed = RegistrationError(
                f"cudaHostUnregister failed for {len(failures)} host pool chunk(s): "
                + "; ".join(failures)
            )
            if interrupted is None:
                raise failed
            interrupted.add_note(str(failed))
        if interrupted is not None:
            raise interrupted


def register_chunks(
    base: int,
    chunks: Sequence[Chunk],
    registrar: Registrar,
    *,
    threads: int = 1,
    progress: Progress | None = None,
) -> Registration:
    """Register every chunk of the buffer at `base`, all or nothing (`Registration.register`)."""
    registration = Registration(base, registrar)
    registration.register(chunks, threads=threads, progress=progress)
    return registration
