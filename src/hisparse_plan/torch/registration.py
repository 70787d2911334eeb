"""Pinning the host pool: register it with CUDA chunk by chunk, all or nothing.

The registrar is a small protocol so the all-or-nothing logic runs, and is tested, without a
GPU; `CudaRegistrar` is the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hisparse_plan.torch.chunks import Chunk
from hisparse_plan.torch.errors import RegistrationError
from hisparse_plan.torch.hostmem import gib

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
            return int(
                _cudart().cudaHostRegister(address, nbytes, CUDA_HOST_REGISTER_PORTABLE)
            )

    def unregister(self, address: int) -> int:
        with torch.cuda.device(self.device_index):
            return int(_cudart().cudaHostUnregister(address))

    def describe(self, code: int) -> str:
        cudart = _cudart()
        try:
            text = str(cudart.cudaGetErrorString(cudart.cudaError(code)))
        except (TypeError, ValueError, RuntimeError):
            text = "unknown CUDA error"
        return f"{text} (cudaError {code})"


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


@dataclass
class Registration:
    """Chunks of one buffer that are registered now; `unregister` undoes them all."""

    base: int
    registrar: Registrar
    chunks: list[Chunk] = field(default_factory=list)

    def unregister(self) -> None:
        """Unregister every chunk, last first; raise once at the end if any call failed."""
        failures = []
        while self.chunks:
            chunk = self.chunks.pop()
            outcome = _call(self.registrar, False, self.base + chunk.start)
            if outcome.code != 0:
                failures.append(f"chunk {chunk.index}: {outcome.why}")
        if failures:
            raise RegistrationError(
                f"cudaHostUnregister failed for {len(failures)} host pool chunk(s): "
                + "; ".join(failures)
            )


def register_chunks(
    base: int, chunks: Sequence[Chunk], registrar: Registrar, *, threads: int = 1
) -> Registration:
    """Register every chunk, `threads` at a time; on any failure unregister the ones that
    succeeded and raise, naming the first chunk that failed."""

    def attempt(chunk: Chunk) -> _Outcome:
        return _call(registrar, True, base + chunk.start, chunk.nbytes)

    outcomes: list[_Outcome] = []
    if threads <= 1:
        for chunk in chunks:
            outcomes.append(attempt(chunk))
            if outcomes[-1].code != 0:
                break
    else:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hisparse-pin") as pool:
            outcomes = list(pool.map(attempt, chunks))
    paired = list(zip(chunks, outcomes, strict=False))
    registration = Registration(base, registrar, [c for c, o in paired if o.code == 0])
    failed = [(chunk, outcome) for chunk, outcome in paired if outcome.code != 0]
    if not failed:
        return registration
    chunk, outcome = failed[0]
    rolled_back = len(registration.chunks)
    try:
        registration.unregister()
        undo = f"rolled back the {rolled_back} chunk(s) that had registered"
    except RegistrationError as error:
        undo = f"and rolling back the {rolled_back} registered chunk(s) failed too: {error}"
    raise RegistrationError(
        f"cudaHostRegister of host pool chunk {chunk.index} (bytes {chunk.start}..{chunk.end}, "
        f"{gib(chunk.nbytes)}) failed: {outcome.why}; {undo}",
        chunk=chunk.index,
        code=outcome.code,
    )
