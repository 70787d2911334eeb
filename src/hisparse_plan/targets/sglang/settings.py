"""What SGLang reads of a request beside its layers: its SGLang settings, the vLLM sections it
refuses rather than ignores, and the settings SGLang's DeepSeek-V4 path does not take. Rules of
the read stage (read.py), one function each."""

from __future__ import annotations

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings


def sglang_settings(request: PlanRequest) -> SGLangSettings:
    """The request's SGLang settings; a request without them is a vLLM request. vLLM's
    pipeline stages are refused (SGLang's are engine.pp_size, one plan a rank), and vLLM's
    decode context parallelism field (SGLang's is engine.dcp_size)."""
    if request.engine is None:
        raise PlanError(
            "engine: expected SGLang settings ({'name': 'sglang', ...}) to plan for SGLang, "
            "got null (a vLLM request)",
            field="engine",
        )
    if request.device.pipeline_stages is not None:
        raise UnsupportedRequestError(
            "device.pipeline_stages: vLLM's stages (layers and memory each) do not apply to "
            "SGLang; expected null, and engine.pp_size with engine.pp_rank for SGLang's "
            "pipeline (each rank's layers as SGLang splits them)",
            field="device.pipeline_stages",
        )
    dcp = request.scheduler.decode_context_parallel_size
    if dcp != 1:
        raise UnsupportedRequestError(
            "scheduler.decode_context_parallel_size: vLLM's decode context parallelism does not "
            f"apply to SGLang; expected 1, and engine.dcp_size for SGLang's, got {dcp}",
            field="scheduler.decode_context_parallel_size",
        )
    return request.engine


def refuse_vllm_sections(request: PlanRequest) -> None:
    """vLLM-only sections have no SGLang meaning: HiSparse on SGLang is engine.enable_hisparse
    (its host pool follows host_to_device_ratio, not a GiB budget), and SGLang's tokens are
    capped by engine.max_total_tokens, not a block count, and its GPU is
    engine.compute_capability. Reading them silently would plan something else than asked."""
    if request.hisparse is not None and request.hisparse.host_pool_layout == "block_outermost":
        raise UnsupportedRequestError(
            "hisparse.host_pool_layout: 'block_outermost' is a vLLM host pool placement; "
            "SGLang 0.5.23 lays out its HiSparse host pool itself (one layer-first [layers, "
            "host tokens, row] buffer), so expected no hisparse section for SGLang (see "
            "docs/transfer.md#placement-that-transfers-well)",
            field="hisparse.host_pool_layout",
        )
    if request.hisparse is not None:
        raise UnsupportedRequestError(
            "hisparse: vLLM's HiSparse settings do not apply to SGLang; expected null, and "
            "engine.enable_hisparse with engine.hisparse_* for SGLang's HiSparse",
            field="hisparse",
        )
    if request.device.num_blocks_override is not None:
        raise UnsupportedRequestError(
            "device.num_blocks_override: vLLM's block count does not apply to SGLang; expected "
            "null, and engine.max_total_tokens to cap SGLang's tokens",
            field="device.num_blocks_override",
        )
    if request.device.compute_capability is not None:
        raise UnsupportedRequestError(
            "device.compute_capability: the GPU vLLM's backends are selected for; expected "
            "null, and engine.compute_capability for the GPU SGLang runs on",
            field="device.compute_capability",
        )


def refuse_v4_settings(settings: SGLangSettings) -> None:
    """Settings SGLang's DeepSeek-V4 path does not take or this planner does not plan:
    a kv dtype other than fp8 (SGLang's paged V4 pools store uint8 rows only), a DSA backend
    (V4 has its own attention backend). Refused before the caches are read, so a V4 request
    with such a setting is refused for the setting whatever its caches. (HiSparse is planned:
    deepseek_v4/hisparse.py.)"""
    if settings.kv_cache_dtype not in ("auto", "fp8_e4m3"):
        raise UnsupportedRequestError(
            "engine.kv_cache_dtype: SGLang's paged DeepSeek-V4 pools store fp8 rows; expected "
            f"auto or fp8_e4m3, got {settings.kv_cache_dtype}",
            field="engine.kv_cache_dtype",
        )
    if settings.dsa_backend is not None:
        raise UnsupportedRequestError(
            "engine.dsa_backend: DeepSeek-V4 runs SGLang's dsv4 attention backend, not a DSA "
            f"backend; expected null, got {settings.dsa_backend}",
            field="engine.dsa_backend",
        )
    if settings.speculative_algorithm is not None:
        raise UnsupportedRequestError(
            "engine.speculative_algorithm: speculative decoding on DeepSeek-V4 (its draft "
            "inflates every V4 pool's bytes a token) is not planned yet; expected null, got "
            f"{settings.speculative_algorithm}",
            field="engine.speculative_algorithm",
        )
