"""HiSparse planned through vLLM's own objects on a machine without CUDA (a CPU build host, CI).

vLLM 0.34 asks the platform's HiSparse backend whether the host pool may be shared
(`vllm.v1.hisparse.layout.use_shared_hisparse_host_pool`); off CUDA there is no backend and the
question raises "The current platform does not support HiSparse", in vLLM's planner and in
`request_from_vllm` alike. Planning needs only the answer, so this module states it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def hisparse_off_cuda(shared_host_pool: bool = False) -> Iterator[None]:
    """Within the block, vLLM's shared-host-pool question answers `shared_host_pool` (what the
    CUDA deployment being planned would answer: True for TP > 1 on 0.34's CUDA backend) instead
    of asking a platform that has no HiSparse backend. Restored on exit."""
    layout: Any = importlib.import_module("vllm.v1.hisparse.layout")
    saved = layout.use_shared_hisparse_host_pool

    def answer(vllm_config: object) -> bool:
        del vllm_config
        return shared_host_pool

    layout.use_shared_hisparse_host_pool = answer
    try:
        yield
    finally:
        layout.use_shared_hisparse_host_pool = saved
