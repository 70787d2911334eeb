"""What SGLang sees of a DeepSeek-V4 request: the request's caches (as vLLM registers them)
sorted into the pools of SGLang's DeepSeekV4TokenToKVPool.

The request describes each decoder layer by its caches: a sliding-window latent cache
(`sliding_window_mla`, model_version deepseek_v4), for a compressed layer its compressed latent
cache (`mla`, model_version deepseek_v4, compress_ratio 4 or 128) and its compressor state
(float32 `sliding_window_mla` rows of 2 * coff * head_dim values over a window of coff * ratio
tokens, coff 2 for ratio 4, else 1), and for a ratio-4 layer its indexer's keys (`mla`,
compress_ratio 4, index_head_dim fp8 bytes and a float32 scale per 128) and the indexer
compressor's state. Everything SGLang sizes from is read off those specs."""

from __future__ import annotations

from dataclasses import dataclass, field

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.layer_specs import LayerSpec, MLASpec, SlidingWindowMLASpec
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.targets.sglang.model import _field, refuse_promoted_window

V4_VERSION = "deepseek_v4"
ROPE_DIM = 64
"""DeepSeek-V4's qk_rope_head_dim; the rest of the 512-element latent is the NoPE part."""
V4_ROW_BYTES = 584
"""SGLang's V4 token row: 448 fp8 NoPE bytes, 64 bf16 RoPE values, 7 scales, 1 pad byte."""
V4_HEAD_DIM = 512
"""The only latent width SGLang's V4 row is defined for (qk_nope 448 + qk_rope 64)."""
INDEX_SCALE_TILE = 128
"""One float32 scale per 128 fp8 index-key values."""
RATIOS = (4, 128)
"""Compression ratios of DeepSeek-V4(-Flash) that SGLang keeps a pool for (V4.1's ratios 1 and
2 are not planned)."""
STATE_DTYPE = "float32"
"""SGLang's compressor-state element type unless SGLANG_DSV4_COMPRESS_STATE_DTYPE says otherwise."""


def state_overlap(ratio: int) -> int:
    """How many windows of a compressor overlap: 2 for ratio 4, else 1 (SGLang's `1 + overlap`
    and vLLM's `coff`)."""
    return 2 if ratio == 4 else 1


@dataclass(frozen=True)
class V4Model:
    """A DeepSeek-V4 request, by the pool SGLang gives each cache (layer names, model order)."""

    swa: tuple[str, ...]
    """One sliding-window cache per decoder layer: SGLang's layer count."""
    window: int
    compressed: dict[int, tuple[str, ...]]
    """Compressed latent caches by compression ratio (4, 128)."""
    states: dict[int, tuple[str, ...]]
    """Attention compressor states by compression ratio."""
    index_keys: tuple[str, ...]
    """The c4 indexer's keys, one per ratio-4 layer."""
    index_states: tuple[str, ...]
    """The c4 indexer compressor's states, one per ratio-4 layer."""
    index_head_dim: int
    qk_nope_head_dim: int = V4_HEAD_DIM - ROPE_DIM
    qk_rope_head_dim: int = ROPE_DIM
    state_widths: dict[str, int] = field(default_factory=dict)
    """Last dim (float32 values) of each state pool's rows, by pool name."""

    @property
    def head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def num_layers(self, ratio: int) -> int:
        """Layers owning ratio's compressed storage."""
        return len(self.compressed.get(ratio, ()))


def is_deepseek_v4(request: PlanRequest) -> bool:
    """A request with any DeepSeek-V4 cache (model_version deepseek_v4)."""
    return any(
        isinstance(spec, SlidingWindowMLASpec | MLASpec) and spec.model_version == V4_VERSION
        for spec in request.layers.values()
    )


def _check_latent_row(name: str, spec: SlidingWindowMLASpec | MLASpec) -> None:
    """SGLang's V4 pools store the 584-byte fp8 row of a 512-element latent (448 NoPE + 64
    RoPE) as uint8; a bf16 row has no paged SGLang pool on CUDA."""
    got = (spec.head_size, spec.dtype, spec.content_bytes)
    want = (V4_HEAD_DIM, "uint8", V4_ROW_BYTES)
    if got != want:
        raise UnsupportedRequestError(
            f"{_field(name)}: SGLang's DeepSeek-V4 pools keep fp8 rows of {V4_ROW_BYTES} bytes "
            f"for a {V4_HEAD_DIM}-element latent; expected (head_size, dtype, "
            f"state_content_bytes) {want}, got {got}",
            field=_field(name),
        )


def _index_head_dim(name: str, spec: MLASpec) -> int:
    """index_head_dim from the key row: dim fp8 bytes plus 4 bytes per 128 (132 -> 128)."""
    row = spec.content_bytes
    tile = INDEX_SCALE_TILE + 4
    if spec.compress_ratio != 4 or row % tile:
        raise UnsupportedRequestError(
            f"{_field(name)}: a DeepSeek-V4 indexer key cache is compress_ratio 4 with rows of "
            f"index_head_dim + index_head_dim / 128 * 4 bytes; expected ratio 4 and a multiple "
            f"of {tile} bytes, got ratio {spec.compress_ratio} and {row} bytes",
            field=_field(name),
        )
    return row // tile * INDEX_SCALE_TILE


@dataclass
class _Sorted:
    swa: list[tuple[str, SlidingWindowMLASpec]] = field(default_factory=list)
    compressed: dict[int, list[str]] = field(default_factory=dict)
    index_keys: list[tuple[str, MLASpec]] = field(default_factory=list)
    states: list[tuple[str, SlidingWindowMLASpec]] = field(default_factory=list)


def _sort_v4_layer(name: str, spec: LayerSpec, out: _Sorted) -> None:
    if isinstance(spec, SlidingWindowMLASpec):
        if spec.model_version == V4_VERSION:
            _check_latent_row(name, spec)
            out.swa.append((name, spec))
        else:
            out.states.append((name, spec))
        return
    if isinstance(spec, MLASpec):
        refuse_promoted_window(name, spec)
        if spec.model_version != V4_VERSION:
            out.index_keys.append((name, spec))
            return
        _check_latent_row(name, spec)
        if spec.compress_ratio not in RATIOS:
            raise UnsupportedRequestError(
                f"{_field(name)}.compress_ratio: SGLang's DeepSeek-V4 pools are planned for "
                f"compression ratios {list(RATIOS)}; got {spec.compress_ratio}",
                field=f"{_field(name)}.compress_ratio",
            )
        out.compressed.setdefault(spec.compress_ratio, []).append(name)
        return
    raise UnsupportedRequestError(
        f"{_field(name)}.kind: a DeepSeek-V4 request holds only its sliding_window_mla and mla "
        f"caches for SGLang; got {spec.kind}",
        field=f"{_field(name)}.kind",
    )


def _one_window(swa: list[tuple[str, SlidingWindowMLASpec]]) -> int:
    """SGLang has one sliding window per model (its config's window_size)."""
    first_name, first = swa[0]
    for name, spec in swa:
        if spec.sliding_window != first.sliding_window:
            raise UnsupportedRequestError(
                f"{_field(name)}.sliding_window: SGLang has one window per model; expected "
                f"{first.sliding_window} as {_field(first_name)}, got {spec.sliding_window}",
                field=f"{_field(name)}.sliding_window",
            )
    return first.sliding_window


def _sort_states(
    states: list[tuple[str, SlidingWindowMLASpec]], head_dim: int, index_head_dim: int | None
) -> dict[str, list[str]]:
    """Compressor states by SGLang pool: the window (coff * ratio tokens) gives the ratio, the
    row width (2 * coff * dim float32 values) whether it is the attention compressor's (dim =
    head_dim) or the indexer's (dim = index_head_dim)."""
    pools: dict[str, list[str]] = {}
    for name, spec in states:
        ratio = next(
            (r for r in RATIOS if spec.sliding_window == state_overlap(r) * r), None
        )
        if spec.dtype != STATE_DTYPE or ratio is None:
            raise UnsupportedRequestError(
                f"{_field(name)}: a DeepSeek-V4 compressor state is float32 (SGLang's default "
                "state dtype) over a window of 8 tokens (ratio 4) or 128 (ratio 128); expected "
                f"(dtype, sliding_window) in {[(STATE_DTYPE, 8), (STATE_DTYPE, 128)]}, got "
                f"{(spec.dtype, spec.sliding_window)}",
                field=_field(name),
            )
        coff = state_overlap(ratio)
        dims = {f"v4_state_c{ratio}": head_dim}
        if ratio == 4 and index_head_dim is not None:
            dims["v4_index_state_c4"] = index_head_dim
        matches = [pool for pool, dim in dims.items() if spec.head_size == 2 * coff * dim]
        if len(matches) != 1:
            want = sorted({2 * coff * dim for dim in dims.values()})
            raise UnsupportedRequestError(
                f"{_field(name)}.head_size: a ratio-{ratio} compressor state keeps 2 * {coff} * "
                f"dim values a row (dim {head_dim} for attention, the index_head_dim for the "
                f"indexer); expected one of {want} naming one pool, got {spec.head_size}",
                field=f"{_field(name)}.head_size",
            )
        pools.setdefault(matches[0], []).append(name)
    return pools


def _expect_count(what: str, names: list[str], expected: int, per: str) -> None:
    if len(names) != expected:
        raise UnsupportedRequestError(
            f"layers: SGLang keeps one {what} per {per}; expected {expected}, got {len(names)}",
            field="layers",
        )


def read_v4_model(request: PlanRequest) -> V4Model:
    """Sort a DeepSeek-V4 request's caches into SGLang's V4 pools, refusing a cache SGLang's
    pools do not hold or counts that do not pair up (every decoder layer one window cache;
    every ratio-4 layer one indexer key cache and two compressor states; every ratio-128 layer
    one compressor state)."""
    out = _Sorted()
    for name, spec in request.layers.items():
        _sort_v4_layer(name, spec, out)
    if not out.swa:
        raise UnsupportedRequestError(
            "layers: a DeepSeek-V4 request needs its sliding_window_mla caches (one per decoder "
            "layer, model_version deepseek_v4); got none", field="layers",
        )
    window = _one_window(out.swa)
    index_dims = {_index_head_dim(name, spec) for name, spec in out.index_keys}
    if len(index_dims) > 1:
        raise UnsupportedRequestError(
            f"layers: SGLang has one index_head_dim per model; got {sorted(index_dims)}",
            field="layers",
        )
    index_dim = next(iter(index_dims), None)
    head_dim = V4_HEAD_DIM
    n4 = len(out.compressed.get(4, []))
    n128 = len(out.compressed.get(128, []))
    states = _sort_states(out.states, head_dim, index_dim)
    _expect_count("indexer key cache", [n for n, _ in out.index_keys], n4, "ratio-4 layer")
    _expect_count("c4 compressor state", states.get("v4_state_c4", []), n4, "ratio-4 layer")
    _expect_count("c4 indexer compressor state", states.get("v4_index_state_c4", []), n4,
                  "ratio-4 layer")
    _expect_count("c128 compressor state", states.get("v4_state_c128", []), n128,
                  "ratio-128 layer")
    if n4 + n128 > len(out.swa):
        raise UnsupportedRequestError(
            f"layers: every DeepSeek-V4 decoder layer has one sliding_window_mla cache; expected "
            f"at least {n4 + n128} (one per compressed layer), got {len(out.swa)}",
            field="layers",
        )
    widths = {"v4_state_c4": 2 * state_overlap(4) * head_dim,
              "v4_state_c128": 2 * state_overlap(128) * head_dim}
    if index_dim is not None:
        widths["v4_index_state_c4"] = 2 * state_overlap(4) * index_dim
    return V4Model(
        swa=tuple(n for n, _ in out.swa),
        window=window,
        compressed={r: tuple(out.compressed[r]) for r in RATIOS if r in out.compressed},
        states={r: tuple(states.get(f"v4_state_c{r}", [])) for r in RATIOS
                if r in out.compressed},
        index_keys=tuple(n for n, _ in out.index_keys),
        index_states=tuple(states.get("v4_index_state_c4", [])),
        index_head_dim=index_dim if index_dim is not None else 0,
        state_widths=widths,
    )
