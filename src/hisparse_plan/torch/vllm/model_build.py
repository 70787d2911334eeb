"""Building vLLM's model classes on the meta device without CUDA (`--specs-from-vllm`): what
torch must stand in for while vLLM's model code runs its constructors."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator

import torch


@contextlib.contextmanager
def inert_cuda_streams() -> Iterator[None]:
    """Without CUDA, `torch.cuda.Stream` and `torch.cuda.Event` stand in as inert objects for
    the duration: model code that makes side streams while it is built (vLLM's Kimi-Linear)
    builds on the meta device, where no kernel runs to use them. Put back after; with CUDA,
    nothing changes."""
    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.Stream, torch.cuda.Event
    torch.cuda.Stream = torch.cuda.Event = _Inert  # type: ignore[assignment, misc]
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.Event = saved  # type: ignore[misc]


@contextlib.contextmanager
def constants_on_cpu(classes: Iterable[type]) -> Iterator[None]:
    """The constructors of `classes` run with the CPU as torch's default device for the
    duration: vLLM layers that work out a Python constant from a tensor while they are built
    (Gemma-3n's `GeluAndMulSparse` takes `.item()` of a normal quantile), which a meta tensor
    cannot give. Such a layer holds no weight, so nothing but that scalar is made on the CPU.
    Put back after."""
    # Each class's own constructor (the layers named define one), put back as it was.
    saved: dict[type, Callable[..., None]] = {cls: vars(cls)["__init__"] for cls in classes}
    for cls, init in saved.items():
        cls.__init__ = _on_cpu(init)  # type: ignore[misc]
    try:
        yield
    finally:
        for cls, init in saved.items():
            cls.__init__ = init  # type: ignore[misc]


def _on_cpu(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def built_on_cpu(self: object, *args: object, **kwargs: object) -> None:
        with torch.device("cpu"):
            init(self, *args, **kwargs)

    return built_on_cpu


class _Inert:
    """A stream or event no kernel waits on: built with any arguments, every method a no-op."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        del args, kwargs

    def __getattr__(self, name: str) -> Callable[..., None]:
        return _nothing


def _nothing(*args: object, **kwargs: object) -> None:
    del args, kwargs
