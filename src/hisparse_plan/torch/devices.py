"""Which device a pool goes to, and the device pool itself.

Asking for CUDA (or pinning, which needs CUDA) on a machine without it is an error, never a
quiet fallback to the CPU: an engine that thinks its cache is on the GPU must not find out from
a slow or failing copy much later.
"""

from __future__ import annotations

import re

import torch

from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.ram import gib

_DEVICE = re.compile(r"(cpu|meta|cuda)(?::(\d+))?")


def _no_cuda() -> str:
    built = torch.version.cuda
    why = "torch was built without CUDA" if built is None else (
        f"torch (CUDA {built}) sees no CUDA device"
    )
    return f"CUDA is not available: {why}"


def meta_device() -> torch.device:
    """The meta device: tensors with sizes and no bytes. A model built under it (as a context
    manager) allocates and loads nothing, yet declares its layers."""
    return torch.device("meta")


def default_device() -> str:
    """"cuda" when torch sees a CUDA device, else "cpu": what a caller without a preference
    should allocate the device pool on."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_device(device: str) -> torch.device:
    """"cpu", "meta", "cuda" (the current device) or "cuda:N", checked against this machine."""
    match = _DEVICE.fullmatch(device)
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise BackendError(
            f"device is {device!r}; expected 'cpu', 'cuda', 'cuda:N' or 'meta'"
        )
    kind = match.group(1)
    if kind != "cuda":
        return torch.device(kind)
    if not torch.cuda.is_available():
        raise BackendError(
            f"device {device!r} was asked for, but {_no_cuda()}; pass device='cpu' and "
            "pin=False to allocate ordinary CPU buffers"
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if match.group(2) is None else int(match.group(2))
    if index >= count:
        raise BackendError(
            f"device {device!r} was asked for, but this machine has {count} CUDA device(s); "
            f"expected an index below {count}"
        )
    return torch.device("cuda", index)


def check_pin(pin: bool, device: torch.device, *, own_registrar: bool = False) -> None:
    """Pinning needs CUDA, unless the caller brings its own registrar (tests do)."""
    if not pin:
        return
    if device.type == "meta":
        raise BackendError(
            "pin=True with device='meta': meta pools hold no memory, so nothing can be pinned; "
            "pass pin=False"
        )
    if not own_registrar and not torch.cuda.is_available():
        raise BackendError(
            f"pin=True needs CUDA to register the host pool, but {_no_cuda()}; pass pin=False "
            "for an unpinned host pool"
        )


def pin_device_index(device: torch.device) -> int:
    """The CUDA device the host pool is registered from: the pool's own, else the current."""
    if device.type == "cuda" and device.index is not None:
        return device.index
    return torch.cuda.current_device()


def allocate_device_pool(
    nbytes: int, device: torch.device, name: str = "device"
) -> torch.Tensor:
    """One flat uint8 buffer of exactly `nbytes` on `device`; `name` says which pool ("device",
    or "stage k device" for a pipeline stage) in errors."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        if nbytes > free:
            raise BackendError(
                f"the {name} pool needs {gib(nbytes)}, but {device} has {gib(free)} free of "
                f"{gib(total)}; expected the plan's device.available_bytes to fit what is free"
            )
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError as error:
        raise BackendError(
            f"allocating the {name} pool of {gib(nbytes)} on {device} failed: {error}"
        ) from error
