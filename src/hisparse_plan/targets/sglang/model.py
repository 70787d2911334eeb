"""What SGLang sees of a model: the request's per-rank layers sorted into the pools SGLang keeps
(full attention, window, latent with or without index keys, recurrent states)."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models.layer_specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVLayerSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from hisparse_plan.models.request import PlanRequest

INDEX_HEAD_DIM = 128
"""Elements of one DSA index key: SGLang accepts no other."""
def index_row_bytes(index_head_dim: int) -> int:
    """Bytes of one token's DSA index key: fp8 values and one float32 scale per 128."""
    return index_head_dim + index_head_dim // 128 * 4


INDEX_ROW_BYTES = index_row_bytes(INDEX_HEAD_DIM)
"""Bytes of one token's index key at SGLang's index_head_dim (132)."""
ROPE_HEAD_DIM = 64
"""The rope part of a latent row (DeepSeek's and GLM's qk_rope_head_dim): the rest is the
kv_lora_rank."""


def refuse_promoted_window(name: str, spec: MLASpec) -> None:
    """An MLA layer that remembers a window was promoted to full blocks by vLLM's one-manager
    mode; SGLang keeps windows in pools of their own, so the request is vLLM's."""
    if spec.sliding_window is not None:
        raise UnsupportedRequestError(
            f"{_field(name)}.sliding_window: a window MLA layer promoted to full blocks is "
            "vLLM's; expected null for SGLang",
            field=f"{_field(name)}.sliding_window",
        )


@dataclass(frozen=True)
class HeadGroup:
    """Layers of one MHA pool: K and V rows of `heads` x `head_dim` / `v_head_dim` elements."""

    names: tuple[str, ...]
    heads: int
    head_dim: int
    v_head_dim: int
    dtype: str
    window: int | None = None


@dataclass(frozen=True)
class LatentGroup:
    """MLA layers: one latent row of `latent_dim` elements per token; with `index_names`, a
    DSA model whose indexer layers keep 132-byte index keys."""

    names: tuple[str, ...]
    latent_dim: int
    dtype: str
    index_names: tuple[str, ...]
    shared_index_names: tuple[str, ...] = ()
    """Latent layers without an indexer of their own (GLM-5-style index sharing): they reuse
    an earlier layer's top-k, and SGLang gives each a zero-row index buffer."""

    @property
    def is_dsa(self) -> bool:
        return bool(self.index_names)

    def every_layer_index(self) -> tuple[str, ...]:
        """One index layer per latent layer, in model order: its indexer, or for a layer that
        shares an index the latent layer itself (SGLang's HiSparse pool indexes every layer)."""
        shared = set(self.shared_index_names)
        own = iter(self.index_names)
        return tuple(name if name in shared else next(own) for name in self.names)

    @property
    def kv_lora_rank(self) -> int:
        return self.latent_dim - ROPE_HEAD_DIM


@dataclass(frozen=True)
class MambaGroup:
    """Recurrent layers as SGLang keeps them: one conv state (dim, kernel - 1) and one
    temporal state per layer and slot."""

    names: tuple[str, ...]
    conv_shape: tuple[int, ...]
    temporal_shape: tuple[int, ...]


@dataclass(frozen=True)
class SGLangModel:
    """The request's layers, by the pool SGLang gives them."""

    full: HeadGroup | None
    swa: HeadGroup | None
    latent: LatentGroup | None
    mamba: MambaGroup | None

    @property
    def window_layers_only(self) -> bool:
        """A pipeline rank keeping window layers and no full-attention or latent layer
        (modes/window_only.py)."""
        return self.swa is not None and self.full is None and self.latent is None

    @property
    def mamba_layers_only(self) -> bool:
        """A pipeline rank keeping Mamba layers and no KV layer (modes/pipeline_stages.py)."""
        return self.mamba is not None and self.full is None and self.swa is None and (
            self.latent is None)


def _field(name: str) -> str:
    return f"layers[{name!r}]"


def refuse_deepseek_v4(request: PlanRequest) -> None:
    """DeepSeek-V4's caches have pools of their own (model_v4 / planner_v4): this reader of the
    other families refuses them, naming the first V4 layer."""
    for name, spec in request.layers.items():
        v4 = isinstance(spec, SlidingWindowMLASpec) or (
            isinstance(spec, MLASpec) and spec.model_version == "deepseek_v4"
        )
        if v4:
            raise UnsupportedRequestError(
                f"{_field(name)}: DeepSeek-V4 caches are read by read_v4_model, not here "
                "(expected full_attention, sliding_window, mla or mamba layers of another model)",
                field=_field(name),
            )


def one_shape(
    names: list[str], specs: list[KVLayerSpec], window: int | None, what: str
) -> HeadGroup:
    """One MHA pool serves layers of one head shape: refuse a second shape, naming its layer."""
    first = specs[0]
    group = HeadGroup(
        tuple(names), first.num_kv_heads, first.head_size, first.value_head_size, first.dtype,
        window,
    )
    for name, spec in zip(names, specs, strict=True):
        got = (spec.num_kv_heads, spec.head_size, spec.value_head_size, spec.dtype)
        want = (group.heads, group.head_dim, group.v_head_dim, group.dtype)
        if got != want:
            raise UnsupportedRequestError(
                f"{_field(name)}: SGLang keeps all {what} layers in one pool of one head shape; "
                f"expected (num_kv_heads, head_size, head_size_v, dtype) {want} as "
                f"{_field(names[0])}, got {got}",
                field=_field(name),
            )
    return group


def _window_group(names: list[str], specs: list[SlidingWindowSpec]) -> HeadGroup:
    """SGLang has one sliding_window_size per model: refuse layers whose windows differ."""
    window = specs[0].sliding_window
    for name, spec in zip(names, specs, strict=True):
        if spec.sliding_window != window:
            raise UnsupportedRequestError(
                f"{_field(name)}.sliding_window: SGLang has one window per model; expected "
                f"{window} as {_field(names[0])}, got {spec.sliding_window}",
                field=f"{_field(name)}.sliding_window",
            )
    return one_shape(names, list(specs), window, "sliding-window")


def _latent_group(
    sparse: list[tuple[str, MLASpec]], index: list[tuple[str, MLASpec]],
    shared: tuple[str, ...] = (),
) -> LatentGroup:
    """MLA layers share one latent width and dtype; a DSA model has one indexer layer per
    latent layer (SGLang's index pool has one buffer per attention layer), each 132 bytes."""
    first_name, first = sparse[0] if sparse else index[0]
    if not sparse:
        raise UnsupportedRequestError(
            f"{_field(first_name)}: indexer layers without latent (sparse) layers; expected "
            "mla layers with cache_role sparse beside them",
            field=_field(first_name),
        )
    for name, spec in sparse:
        if (spec.head_size, spec.dtype) != (first.head_size, first.dtype):
            raise UnsupportedRequestError(
                f"{_field(name)}: SGLang keeps all MLA layers in one pool; expected "
                f"(head_size, dtype) {(first.head_size, first.dtype)} as {_field(first_name)}, "
                f"got {(spec.head_size, spec.dtype)}",
                field=_field(name),
            )
        if spec.compress_ratio != 1:
            raise UnsupportedRequestError(
                f"{_field(name)}.compress_ratio: SGLang's MLA pool stores every token; "
                f"expected 1, got {spec.compress_ratio}",
                field=f"{_field(name)}.compress_ratio",
            )
    if first.head_size <= ROPE_HEAD_DIM:
        raise PlanError(
            f"{_field(first_name)}.head_size: expected a latent row wider than its "
            f"{ROPE_HEAD_DIM}-element rope part (kv_lora_rank + 64), got {first.head_size}",
            field=f"{_field(first_name)}.head_size",
        )
    for name, spec in index:
        if spec.content_bytes != INDEX_ROW_BYTES:
            raise UnsupportedRequestError(
                f"{_field(name)}: SGLang's DSA index keys are {INDEX_ROW_BYTES} bytes a token "
                f"(index_head_dim {INDEX_HEAD_DIM}); expected {INDEX_ROW_BYTES}, got "
                f"{spec.content_bytes}",
                field=_field(name),
            )
    if index and len(index) + len(shared) != len(sparse):
        raise UnsupportedRequestError(
            f"layers: SGLang's DSA pool keeps index keys for every attention layer that runs an "
            f"indexer; expected {len(sparse) - len(shared)} indexer layers (one per sparse layer "
            f"less the {len(shared)} sharing one), got {len(index)}",
            field="layers",
        )
    dtype = "float8_e4m3fn" if first.cache_dtype == "fp8_ds_mla" else first.dtype
    return LatentGroup(
        tuple(n for n, _ in sparse), first.head_size, dtype, tuple(n for n, _ in index),
        shared if index else (),
    )


def shared_index_layers(request: PlanRequest) -> tuple[str, ...]:
    """The sparse (latent) layers that run no indexer of their own: an indexer layer follows
    its own sparse layer in model order, so a sparse layer no indexer follows shares an
    earlier one's top-k. An indexer with no sparse layer before it, or two after one, is
    refused."""
    mla = [spec for spec in request.layers.values() if isinstance(spec, MLASpec)]
    indexers = sum(spec.cache_role == "indexer" for spec in mla)
    if indexers == 0 or indexers >= len(mla) - indexers:
        return ()  # no index, or one for every layer (too many: _latent_group refuses)
    last: str | None = None
    owned: set[str] = set()
    sparse: list[str] = []
    for name, spec in request.layers.items():
        if not isinstance(spec, MLASpec):
            continue
        if spec.cache_role != "indexer":
            last = name
            sparse.append(name)
            continue
        if last is None or last in owned:
            raise UnsupportedRequestError(
                f"{_field(name)}: an indexer layer follows the sparse layer it indexes; "
                "expected a sparse mla layer without an indexer just before it",
                field=_field(name),
            )
        owned.add(last)
    return tuple(name for name in sparse if name not in owned) if owned else ()


def mamba_group(names: list[str], specs: list[MambaSpec]) -> MambaGroup:
    """SGLang's MambaPool keeps one conv state and one temporal state per layer. The request
    gives vLLM's conv shape (kernel - 1, dim); SGLang stores it as (dim, kernel - 1)."""
    first = specs[0]
    for name, spec in zip(names, specs, strict=True):
        if len(spec.state_shapes) != 2:
            raise UnsupportedRequestError(
                f"{_field(name)}.state_shapes: SGLang's Mamba pool keeps a conv and a temporal "
                f"state; expected 2 shapes, got {len(spec.state_shapes)}",
                field=f"{_field(name)}.state_shapes",
            )
        if spec.state_shapes != first.state_shapes:
            raise UnsupportedRequestError(
                f"{_field(name)}.state_shapes: SGLang keeps every Mamba layer in one pool; "
                f"expected {list(first.state_shapes)} as {_field(names[0])}, got "
                f"{list(spec.state_shapes)}",
                field=f"{_field(name)}.state_shapes",
            )
    conv, temporal = first.state_shapes
    if len(conv) != 2:
        raise UnsupportedRequestError(
            f"{_field(names[0])}.state_shapes[0]: expected a 2-D conv state (kernel - 1, dim), "
            f"got {list(conv)}",
            field=f"{_field(names[0])}.state_shapes[0]",
        )
    return MambaGroup(tuple(names), (conv[1], conv[0]), tuple(temporal))


def read_model(
    request: PlanRequest, *, windows_as_full: bool = False, stage_of_hybrid: bool = False
) -> SGLangModel:
    """Sort the request's layers (model order kept) into SGLang's pools, refusing what SGLang
    cannot hold: chunked-local layers (a Llama-4 window hybrid is read by served/llama4.py), layers
    promoted to full blocks, MLA beside window or Mamba layers, Mamba beside window layers, and
    a model of window layers only (with `stage_of_hybrid`, the request is a pipeline rank's
    share of a model with full-attention layers, which other ranks may keep). With
    `windows_as_full` (a model SGLang does not serve as a window hybrid) window and
    chunked-local layers join the full pool."""
    refuse_deepseek_v4(request)
    full: tuple[list[str], list[KVLayerSpec]] = ([], [])
    swa: tuple[list[str], list[SlidingWindowSpec]] = ([], [])
    sparse: list[tuple[str, MLASpec]] = []
    index: list[tuple[str, MLASpec]] = []
    mamba: tuple[list[str], list[MambaSpec]] = ([], [])
    for name, spec in request.layers.items():
        if windows_as_full and isinstance(spec, SlidingWindowSpec | ChunkedLocalAttentionSpec):
            full[0].append(name)
            full[1].append(spec)
            continue
        _sort_layer(name, spec, full, swa, sparse, index, mamba)
    latent = (_latent_group(sparse, index, shared_index_layers(request))
              if sparse or index else None)
    kinds = {
        "full_attention": bool(full[0]), "sliding_window": bool(swa[0]),
        "mla": latent is not None, "mamba": bool(mamba[0]),
    }
    _refuse_mixes(kinds, stage_of_hybrid)
    return SGLangModel(
        full=one_shape(full[0], full[1], None, "full-attention") if full[0] else None,
        swa=_window_group(*swa) if swa[0] else None,
        latent=latent,
        mamba=mamba_group(*mamba) if mamba[0] else None,
    )


def _sort_layer(
    name: str,
    spec: LayerSpec,
    full: tuple[list[str], list[KVLayerSpec]],
    swa: tuple[list[str], list[SlidingWindowSpec]],
    sparse: list[tuple[str, MLASpec]],
    index: list[tuple[str, MLASpec]],
    mamba: tuple[list[str], list[MambaSpec]],
) -> None:
    if isinstance(spec, FullAttentionSpec):
        if spec.sliding_window is not None or spec.attention_chunk_size is not None:
            raise UnsupportedRequestError(
                f"{_field(name)}: a window layer promoted to full blocks is vLLM's; expected "
                "the layer as sliding_window (SGLang keeps its own window pool)",
                field=_field(name),
            )
        full[0].append(name)
        full[1].append(spec)
    elif isinstance(spec, SlidingWindowSpec):
        swa[0].append(name)
        swa[1].append(spec)
    elif isinstance(spec, MLASpec):
        refuse_promoted_window(name, spec)
        (index if spec.cache_role == "indexer" else sparse).append((name, spec))
    elif isinstance(spec, MambaSpec):
        mamba[0].append(name)
        mamba[1].append(spec)
    else:
        kind = "chunked_local_attention" if isinstance(spec, ChunkedLocalAttentionSpec) else (
            spec.kind
        )
        raise UnsupportedRequestError(
            f"{_field(name)}.kind: {kind} layers are not planned for SGLang; expected "
            "full_attention, sliding_window, mla or mamba",
            field=f"{_field(name)}.kind",
        )


def _refuse_mixes(kinds: dict[str, bool], stage_of_hybrid: bool) -> None:
    """Pairs of layer kinds the planner does not put in one SGLang model."""
    refused = [
        ("mla", "sliding_window", "MLA beside sliding-window layers (SGLang's latent window "
         "pool takes MLA window layers, which the request does not describe)"),
        ("mla", "full_attention", "MLA beside MHA full-attention layers"),
        ("mla", "mamba", "MLA beside Mamba layers"),
        ("mamba", "sliding_window", "Mamba beside sliding-window layers"),
    ]
    for a, b, what in refused:
        if kinds[a] and kinds[b]:
            raise UnsupportedRequestError(
                f"layers: {what} is not planned for SGLang; expected layers of one attention "
                "family", field="layers",
            )
    window_only_rank = stage_of_hybrid and kinds["sliding_window"]
    if kinds["sliding_window"] and not kinds["full_attention"] and not window_only_rank:
        raise UnsupportedRequestError(
            "layers: a model of sliding-window layers only is not planned for SGLang; "
            "expected at least one full_attention layer", field="layers",
        )
    mamba_only_rank = stage_of_hybrid and kinds["mamba"]
    if not (kinds["full_attention"] or kinds["mla"] or window_only_rank or mamba_only_rank):
        raise UnsupportedRequestError(
            "layers: SGLang needs attention layers beside Mamba layers; expected at least one "
            "full_attention or mla layer", field="layers",
        )


def state_elements(shape: tuple[int, ...]) -> int:
    return prod(shape)
