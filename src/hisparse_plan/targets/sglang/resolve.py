"""Stage 2, resolve the server defaults: every setting SGLang fills in when it is not given,
for this model (defaults.py; DeepSeek-V4's own defaults, deepseek_v4/defaults.py), and the
settings the model refuses. Hands the next stage `Defaults` (or `DefaultsV4`), with the `Read`
it came from."""

from __future__ import annotations

from dataclasses import dataclass

from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.deepseek_v4.defaults import (
    v4_page_size,
    v4_requested_requests,
    v4_static_fraction,
    v4_swa_ratio,
)
from hisparse_plan.targets.sglang.defaults import (
    DSA_PAGE_SIZE,
    MAMBA_CONV_DTYPE,
    CacheDtype,
    LatentRow,
    cache_dtype,
    default_page_size,
    hisparse_buffer_size,
    hisparse_device_buffer,
    hisparse_top_k,
    latent_row,
    refuse_hisparse_without_dsa,
    ssm_dtype,
    static_fraction,
    swa_full_tokens_ratio,
)
from hisparse_plan.targets.sglang.linear_attention_page import hybrid_linear_page
from hisparse_plan.targets.sglang.model import SGLangModel
from hisparse_plan.targets.sglang.modes.dcp import refuse_dcp
from hisparse_plan.targets.sglang.modes.speculative import (
    SPECULATIVE_MAX_RUNNING_REQUESTS,
    Speculative,
    refuse_tree_on_paged_backend,
    refuse_unplanned_speculative,
    resolve_speculative,
    tree_keeps_unpaged,
)
from hisparse_plan.targets.sglang.platform import blackwell_mla, platform_defaults
from hisparse_plan.targets.sglang.read import Read, ReadV4
from hisparse_plan.targets.trace import Trace

STAGE = "resolve"
PLATFORM = "sglang.platform"
POOLS = "sglang.pools"
BUDGET = "sglang.budget"
SPECULATIVE = "sglang.speculative"


@dataclass(frozen=True, slots=True)
class Defaults:
    """The settings the pools are sized and laid out with, SGLang's defaults filled in."""

    read: Read
    page_size: int
    mem_fraction_static: float | None
    """Given, else SGLang's rule for the GPU (gpu_memory_bytes), else unknown (None)."""
    swa_full_tokens_ratio: float
    full_dtype: CacheDtype | None
    """The full-attention pool's element type (None without full-attention layers)."""
    swa_dtype: CacheDtype | None
    latent_row: LatentRow | None
    mamba_dtypes: tuple[str, str] | None
    """(conv, temporal) state dtypes of a Mamba hybrid."""
    hisparse_buffer: int | None
    """HiSparse's device buffer rows a request (None: HiSparse off)."""
    hisparse_top_k: int = 0
    """The top-k HiSparse runs (hisparse_top_k); 0 with HiSparse off."""
    speculative: Speculative | None = None
    """Speculative decoding's resolved settings and draft layers (None: off)."""


@dataclass(frozen=True, slots=True)
class DefaultsV4:
    """DeepSeek-V4's settings, its model override's defaults filled in."""

    read: ReadV4
    page_size: int
    mem_fraction_static: float | None
    swa_full_tokens_ratio: float
    requested_requests: int
    """The running requests the c128 state rings are budgeted for."""
    hisparse_buffer: int | None = None
    """HiSparse's device buffer rows a request (None: HiSparse off)."""
    hisparse_top_k: int = 0


def resolve(read: Read | ReadV4, trace: Trace) -> Defaults | DefaultsV4:
    """The refusals in SGLang's order: HiSparse on a model without DSA, its hot buffer, then
    the default fraction (whose rule refuses a GPU too small for its reserve)."""
    if isinstance(read, ReadV4):
        return _resolve_v4(read, trace)
    settings, model = read.settings, read.model
    refuse_hisparse_without_dsa(settings, model)
    refuse_dcp(settings, model)
    top_k = hisparse_top_k(settings, read.index_topk)
    # Checked against top_k after the pools (size.py), where SGLang's first decode fails.
    buffer = hisparse_buffer_size(settings) if settings.enable_hisparse else None
    page = hybrid_linear_page(settings, model)
    if page is None:
        page = (_unforced_page(settings, model) if tree_keeps_unpaged(settings, model)
                else default_page_size(settings, model))
    if settings.speculative_algorithm is not None:
        refuse_unplanned_speculative(settings, model)
    speculative = resolve_speculative(settings)
    refuse_tree_on_paged_backend(speculative, page, model, blackwell_mla(settings, model))
    defaults = Defaults(
        read=read,
        page_size=page,
        mem_fraction_static=static_fraction(settings, model),
        swa_full_tokens_ratio=swa_full_tokens_ratio(settings),
        full_dtype=None if model.full is None else cache_dtype(settings, model.full.dtype),
        swa_dtype=None if model.swa is None else cache_dtype(settings, model.swa.dtype),
        latent_row=None if model.latent is None else latent_row(settings, model.latent),
        mamba_dtypes=None if model.mamba is None else (MAMBA_CONV_DTYPE, ssm_dtype(settings)),
        hisparse_buffer=buffer,
        hisparse_top_k=top_k if buffer is not None else 0,
        speculative=speculative,
    )
    if trace.enabled:
        for subject, value, why in platform_defaults(settings, model, _unforced_page(settings,
                                                                                  model)):
            trace.add(STAGE, PLATFORM, subject, value, why)
        _trace_defaults(defaults, trace)
        _trace_speculative(settings, defaults.speculative, trace)
    return defaults


def _unforced_page(settings: SGLangSettings, model: SGLangModel) -> int:
    """The page before the GPU's backend constraints (to say whether they moved it)."""
    if settings.page_size is not None:
        return settings.page_size
    return DSA_PAGE_SIZE if model.latent is not None and model.latent.is_dsa else 1


def _resolve_v4(read: ReadV4, trace: Trace) -> DefaultsV4:
    settings = read.settings
    top_k = hisparse_top_k(settings, read.index_topk)
    buffer = hisparse_device_buffer(settings, top_k) if settings.enable_hisparse else None
    defaults = DefaultsV4(
        read=read,
        page_size=v4_page_size(settings),
        mem_fraction_static=v4_static_fraction(settings),
        swa_full_tokens_ratio=v4_swa_ratio(settings),
        requested_requests=v4_requested_requests(settings),
        hisparse_buffer=buffer,
        hisparse_top_k=top_k if buffer is not None else 0,
    )
    if trace.enabled:
        trace.add(STAGE, POOLS, "page_size", defaults.page_size,
                  "256: SGLang's DeepSeek-V4 override sets it over any --page-size")
        _trace_fraction(settings, defaults.mem_fraction_static, trace)
        trace.add(STAGE, BUDGET, "swa_full_tokens_ratio", defaults.swa_full_tokens_ratio,
                  _given(settings, "swa_full_tokens_ratio") or "DeepSeek-V4's override: 0.1")
        trace.add(STAGE, BUDGET, "requests the c128 state rings are budgeted for",
                  defaults.requested_requests,
                  _given(settings, "max_running_requests") or "DeepSeek-V4's hook: 256")
    return defaults


def _given(settings: SGLangSettings, field: str) -> str:
    """The words "<field> given" when the settings set `field`, else "" (so that the
    default's words follow `or`)."""
    return "" if getattr(settings, field) is None else f"{field} given"


def _trace_fraction(settings: SGLangSettings, fraction: float | None, trace: Trace) -> None:
    if settings.mem_fraction_static is not None:
        why = "mem_fraction_static given"
    elif fraction is None:
        why = ("none given and gpu_memory_bytes unknown: only a budget given outright "
               "(device.available_bytes) can be planned")
    else:
        why = (f"SGLang's rule for a GPU of {settings.gpu_memory_bytes} bytes: what is left of "
               "it after activations, metadata, the parallel groups and CUDA graphs, over it")
    trace.add(STAGE, BUDGET, "mem_fraction_static", "null" if fraction is None else fraction,
              why)


def _trace_defaults(defaults: Defaults, trace: Trace) -> None:
    settings, model = defaults.read.settings, defaults.read.model
    dsa = model.latent is not None and model.latent.is_dsa
    if dsa:
        why = ("64: a DSA model's index keys are paged by 64 tokens" + (
            "" if settings.page_size in (None, defaults.page_size) else
            f"; SGLang rewrites the given {settings.page_size} to it with a warning"))
    elif hybrid_linear_page(settings, model) is not None:
        backend = "trtllm_mha" if defaults.page_size > 1 else "triton"
        why = (f"SM100's hybrid linear-attention override: the {backend} attention backend it "
               "picks, whose page it sets over any given")
    else:
        why = _given(settings, "page_size") or "1: SGLang's default for a model without DSA layers"
    trace.add(STAGE, POOLS, "page_size", defaults.page_size, why)
    for pool, group, dtype in (("kv", model.full, defaults.full_dtype),
                               ("swa", model.swa, defaults.swa_dtype)):
        if group is not None and dtype is not None:
            _trace_dtype(settings, pool, group.dtype, dtype, trace)
    row = defaults.latent_row
    if model.latent is not None and row is not None:
        _trace_dtype(settings, "kv", model.latent.dtype, row.dtype, trace)
        packed = row.elements != model.latent.latent_dim
        trace.add(STAGE, POOLS, "kv row elements", row.elements, (
            f"a DSA fp8 row packed for {settings.dsa_backend or 'flashmla_kv'}: kv_lora_rank "
            f"{model.latent.kv_lora_rank} fp8 bytes + one float32 scale per 128 + 64 bfloat16 "
            f"rope values; {row.nbytes} bytes") if packed else (
            f"the raw latent row (kv_lora_rank + 64 rope): {row.nbytes} bytes"))
    _trace_fraction(settings, defaults.mem_fraction_static, trace)
    if model.swa is not None:
        trace.add(STAGE, BUDGET, "swa_full_tokens_ratio", defaults.swa_full_tokens_ratio,
                  _given(settings, "swa_full_tokens_ratio") or "SGLang's default: 0.8")
    if defaults.mamba_dtypes is not None:
        conv, ssm = defaults.mamba_dtypes
        trace.add(STAGE, POOLS, "mamba state dtypes", f"{conv}, {ssm}",
                  "conv states bfloat16; temporal states " + (
                      _given(settings, "mamba_ssm_dtype") or "float32, SGLang's default"))
    if defaults.hisparse_buffer is not None:
        trace.add(STAGE, POOLS, "hisparse.device_buffer_size", defaults.hisparse_buffer,
                  _given(settings, "hisparse_device_buffer_size")
                  or f"2 x top_k ({settings.hisparse_top_k})")
        trace.add(STAGE, POOLS, "hisparse.top_k", defaults.hisparse_top_k,
                  "the model's index_topk, what SGLang's coordinator runs"
                  if defaults.read.index_topk is not None else "hisparse_config's top_k")


def _trace_dtype(
    settings: SGLangSettings, pool: str, layer_dtype: str, dtype: CacheDtype, trace: Trace
) -> None:
    source = (f"the layers' {layer_dtype} (kv_cache_dtype auto)"
              if settings.kv_cache_dtype == "auto" else f"kv_cache_dtype {settings.kv_cache_dtype}")
    stored = "" if dtype.store == dtype.cache else f", stored as {dtype.store}"
    trace.add(STAGE, POOLS, f"{pool} dtype", dtype.cache, f"{source}{stored}")


def _trace_speculative(
    settings: SGLangSettings, spec: Speculative | None, trace: Trace
) -> None:
    if spec is None:
        return
    named = settings.speculative_algorithm
    trace.add(STAGE, SPECULATIVE, "speculative_algorithm", spec.algorithm,
              "NEXTN runs as EAGLE (the model's own MTP layers as the draft)"
              if named == "NEXTN" else f"{named} given")
    trace.add(STAGE, SPECULATIVE, "steps, top-k, draft tokens",
              f"{spec.num_steps}, {spec.eagle_topk}, {spec.num_draft_tokens}",
              _given(settings, "speculative_num_steps") or (
                  f"SGLang's choice for {settings.architecture or 'the architecture'}")
              + ("; draft tokens num_steps + 1 with top-k 1" if spec.eagle_topk == 1 else ""))
    trace.add(STAGE, SPECULATIVE, "draft layers", spec.draft_layers,
              "the draft's KV layers (speculative_draft_num_layers), its own ids from 0, "
              "sharing the target's allocator and token count")
    if spec.draft_window_layers:
        trace.add(STAGE, SPECULATIVE, "draft window layers", spec.draft_window_layers,
                  f"a hybrid-window draft: draft_swa holds them over the window pool's tokens, "
                  f"draft_kv its {spec.draft_full_layers} full layers over the full pool's")
    trace.add(STAGE, SPECULATIVE, "max_running_requests default",
              settings.max_running_requests or SPECULATIVE_MAX_RUNNING_REQUESTS,
              _given(settings, "max_running_requests")
              or f"{SPECULATIVE_MAX_RUNNING_REQUESTS}, SGLang's default with speculative "
              "decoding")
