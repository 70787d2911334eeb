"""Split: the registration chunks are now `hisparse_plan.torch.hostmem.chunks`, and a vLLM
plan's host trains (`host_trains`) `hisparse_plan.torch.vllm.host`. This old path re-exports
what it held, with a DeprecationWarning."""

from hisparse_plan._moved import deprecated_path
from hisparse_plan.torch.hostmem.chunks import (
    CHUNK_BYTES,
    MAX_REGISTRATION_BYTES,
    Chunk,
    lowest_crossing,
    plan_chunks,
    validate_chunk_bytes,
)
from hisparse_plan.torch.vllm.host import host_trains

deprecated_path(__name__, "hisparse_plan.torch.hostmem.chunks and hisparse_plan.torch.vllm.host")

__all__ = [
    "CHUNK_BYTES",
    "MAX_REGISTRATION_BYTES",
    "Chunk",
    "host_trains",
    "lowest_crossing",
    "plan_chunks",
    "validate_chunk_bytes",
]
