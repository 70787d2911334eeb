"""Building vLLM's model classes on the meta device without CUDA (`--specs-from-vllm`): what
torch must stand in for while vLLM's model code runs its constructors."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

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


class _Inert:
    """A stream or event no kernel waits on: built with any arguments, every method a no-op."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        del args, kwargs

    def __getattr__(self, name: str) -> Callable[..., None]:
        return _nothing


def _nothing(*args: object, **kwargs: object) -> None:
    del args, kwargs
