"""SGLang 0.5.23's default `--mem-fraction-static` for a GPU, as its memory settings hook
computes it when the flag is not given (see docs/planning-rules.md#sglang).

In MB (2**20 bytes) of the GPU's total memory: reserved = 512 + max(chunked prefill, 2048) x
1.5 + tp x pp / 8 x 1024 + the CUDA-graph reserve (decode max batch x 2, plus prefill graphs:
8 per captured size, or 1536 for MLA models); at least 10240 on a GPU above 60 GB; then
fraction = round((gpu - reserved) / gpu, 3). Chunked prefill and decode max batch default by
the GPU's memory. Data-parallel attention, DeepEP, speculative decoding and multimodal models
reserve more and are not modelled here: give the fraction for them.
"""

from __future__ import annotations

from typing import Final

MB: Final = 1 << 20


def _graph_defaults(gpu_mb: float, tp: int) -> tuple[int, int]:
    """(chunked prefill size, decode CUDA-graph max batch) SGLang picks for the GPU."""
    if gpu_mb < 20 * 1024:
        return 2048, 8
    if gpu_mb < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mb < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mb < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _prefill_graph_sizes(max_bs: int) -> int:
    """How many prefill token counts SGLang captures graphs for, up to max_bs."""
    sizes = (
        list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
        + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return sum(1 for size in sizes if size <= max_bs)


def default_mem_fraction_static(
    gpu_bytes: int, *, tp: int = 1, pp: int = 1, mla: bool = False,
    max_running_requests: int | None = None,
) -> float:
    """SGLang's default mem_fraction_static on a GPU of `gpu_bytes` total memory."""
    gpu_mb = gpu_bytes / MB
    chunked, decode_bs = _graph_defaults(gpu_mb, tp)
    if max_running_requests is not None:
        decode_bs = min(decode_bs, max_running_requests)
    reserved = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024
    reserved += decode_bs * 2
    reserved += 1.5 * 1024 if mla else _prefill_graph_sizes(min(8192, chunked) if mla
                                                              else chunked) * 8
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3)
