"""Which attention backend vLLM 0.34 gives each kind of layer of a request on a CUDA GPU, and
the KV-cache layout the backends resolve to."""

from __future__ import annotations

from dataclasses import dataclass, field

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.layer_specs import LatentLayerSpec, MLASpec
from hisparse_plan.models.layout import KVCacheLayout
from hisparse_plan.targets.vllm.platform.backends import (
    BACKENDS,
    Query,
    declared_layouts,
    refusals,
)
from hisparse_plan.targets.vllm.platform.layout import LayoutResolution, resolve_layout
from hisparse_plan.targets.vllm.platform.priorities import Capability, backend_priorities

FP8_DTYPES = frozenset({"float8_e4m3fn", "float8_e5m2", "uint8"})
"""A K/V layer's cache dtype for an fp8 KV cache (vLLM stores it as bytes)."""


@dataclass(frozen=True, slots=True)
class Platform:
    """The GPU and what vLLM is told about backends: `--attention-backend` (None: vLLM's own
    choice) and whether FlashInfer is installed (vLLM's CUDA wheel depends on it)."""

    capability: Capability
    attention_backend: str | None = None
    flashinfer: bool = True

    @property
    def words(self) -> str:
        major, minor = self.capability
        return f"compute capability {major}.{minor}"


@dataclass(frozen=True, slots=True)
class AttentionLayer:
    """A kind of layer and what it asks the selector, or the backend the model fixes."""

    kind: str
    query: Query | None = None
    fixed: str | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    platform: Platform
    backends: dict[str, str]
    """Each layer kind's backend."""
    layout: LayoutResolution
    why: tuple[str, ...] = field(default=())


def select_backend(layer: AttentionLayer, platform: Platform) -> str:
    """The backend vLLM selects for `layer` (vllm/v1/attention/selector.py `get_attn_backend`,
    vllm/platforms/cuda.py `get_attn_backend_cls`): the `--attention-backend` one if it can
    serve the layer (else refused, as vLLM refuses it), otherwise the first valid backend in
    the priority order; none valid is refused."""
    if layer.fixed is not None:
        return layer.fixed
    query = layer.query
    if query is None:
        raise UnsupportedRequestError(f"layer kind {layer.kind!r}: expected a query or a backend")
    capability = platform.capability
    chosen = platform.attention_backend
    if chosen is not None:
        backend = BACKENDS.get(chosen)
        if backend is None:
            raise UnsupportedRequestError(
                f"attention_backend: expected one of {', '.join(BACKENDS)}, got {chosen!r}")
        reasons = refusals(backend, query, capability, platform.flashinfer)
        if reasons:
            raise UnsupportedRequestError(
                f"attention_backend: selected backend {chosen} is not valid for the "
                f"{layer.kind} layers on {platform.words}: {', '.join(reasons)} "
                "(vllm/platforms/cuda.py get_attn_backend_cls)")
        return chosen
    order = backend_priorities(query.mla, capability, num_heads=query.num_heads,
                               kv_dtype=query.kv_dtype, head_size=query.head_size)
    found: list[str] = []
    for name in order:
        reasons = refusals(BACKENDS[name], query, capability, platform.flashinfer)
        if not reasons:
            return name
        found.append(f"{name}: [{', '.join(reasons)}]")
    raise UnsupportedRequestError(
        f"no valid attention backend for the {layer.kind} layers on {platform.words} "
        f"(head_size {query.head_size}, kv_cache_dtype {query.kv_dtype}): {'; '.join(found)} "
        "(vllm/platforms/cuda.py get_attn_backend_cls)")


def _dsv4_backends(platform: Platform) -> list[AttentionLayer]:
    """DeepSeek-V4's attention classes (vllm/models/deepseek_v4/nvidia/model.py
    `_select_dsv4_attn_cls`): FlashInfer's on 12.x or when asked for, else FlashMLA's; its SWA,
    compressor and indexer backends beside them."""
    chosen = platform.attention_backend
    if chosen in ("FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120"):
        raise UnsupportedRequestError(
            f"attention_backend: {chosen} is not a DeepSeek V4 attention backend; use "
            "FLASHINFER_MLA_SPARSE_DSV4 (vllm/models/deepseek_v4/nvidia/model.py)")
    flashinfer = chosen == "FLASHINFER_MLA_SPARSE_DSV4" or (
        chosen not in ("FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4") and platform.capability[0] == 12)
    mla = "FLASHINFER_MLA_SPARSE_DSV4" if flashinfer else "FLASHMLA_SPARSE_DSV4"
    return [AttentionLayer("dsv4_mla", fixed=mla),
            AttentionLayer("dsv4_swa", fixed="DEEPSEEK_SPARSE_SWA"),
            AttentionLayer("dsv4_compressor", fixed="CompressorBackend"),
            AttentionLayer("dsv4_indexer", fixed="DEEPSEEK_V4_INDEXER")]


def _kv_dtype(spec: object) -> str:
    if isinstance(spec, LatentLayerSpec) and spec.cache_dtype:
        return spec.cache_dtype
    return "fp8" if getattr(spec, "dtype", "") in FP8_DTYPES else "auto"


def layers_of(request: PlanRequest, platform: Platform, *, sinks: bool = False,
              num_heads: int | None = None) -> list[AttentionLayer]:
    """The request's kinds of attention layer, each once, in model order. `sinks`: the
    model's attention layers keep sinks (gpt-oss); `num_heads`: query heads per rank (the
    10.x sparse-MLA order reads it). Mamba and other state layers take no attention backend."""
    specs = list(request.layers.values())
    if any(isinstance(spec, LatentLayerSpec) and spec.model_version == "deepseek_v4"
           for spec in specs):
        return _dsv4_backends(platform)
    sparse = any(isinstance(spec, MLASpec) and spec.cache_role == "indexer" for spec in specs)
    kinds: dict[str, AttentionLayer] = {}
    for spec in specs:
        if isinstance(spec, MLASpec) and spec.cache_role == "indexer":
            kinds.setdefault("indexer", AttentionLayer("indexer", fixed="DEEPSEEK_V32_INDEXER"))
        elif isinstance(spec, MLASpec):
            kind = "sparse_mla" if sparse else "mla"
            kinds.setdefault(kind, AttentionLayer(kind, Query(
                spec.head_size, _kv_dtype(spec), mla=True, sparse=sparse,
                num_heads=num_heads)))
        elif spec.kind in ("full_attention", "sliding_window", "chunked_local_attention"):
            kind = {"full_attention": "full", "sliding_window": "sliding",
                    "chunked_local_attention": "chunked"}[spec.kind]
            kinds.setdefault(kind, AttentionLayer(kind, Query(
                getattr(spec, "head_size", 0), _kv_dtype(spec), sink=sinks)))
    return list(kinds.values())


def resolve_platform(
    request: PlanRequest, platform: Platform, *, requested: KVCacheLayout | None = None,
    sinks: bool = False, num_heads: int | None = None, extensible: bool = True,
) -> Resolution:
    """Each layer kind's backend and the layout vLLM resolves from them; `requested` stands
    for `VLLM_KV_CACHE_LAYOUT` (refused where vLLM refuses it)."""
    layers = layers_of(request, platform, sinks=sinks, num_heads=num_heads)
    backends = {layer.kind: select_backend(layer, platform) for layer in layers}
    declared = [layouts for name in dict.fromkeys(backends.values())
                if (layouts := declared_layouts(name, platform.capability)) is not None]
    layout = resolve_layout(
        declared, mixed_shapes=_mixed_shapes(request), hisparse=request.hisparse is not None,
        extensible=extensible, requested=requested, platform=platform.words)
    return Resolution(platform, backends, layout)


def _mixed_shapes(request: PlanRequest) -> bool:
    """The request's attention layers differ in (heads, states, page bytes) (vLLM's
    `resolve_kv_cache_layout` then keeps block-compact layouts only); HiSparse's derived
    resident and hot layers differ from the source rows they copy."""
    if request.hisparse is not None:
        return True
    shapes = {(getattr(spec, "num_kv_heads", 1), 1 if isinstance(spec, LatentLayerSpec) else 2,
               spec.page_size_bytes)
              for spec in request.layers.values() if spec.kind != "mamba"}
    return len(shapes) > 1
