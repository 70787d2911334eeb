"""vLLM layer specs as request layers (SPEC 4, 4.1), read by attribute: no vLLM import.

Each vLLM `KVCacheSpec` class maps to one request kind. Fields that change a page or a grouping
but that the request contract cannot say are refused when set; fields that change neither but
take part in vLLM's spec equality must hold one value per spec class across the request, so that
vLLM's grouping by equality and ours agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.dtypes import DTYPE_SIZE
from hisparse_plan.rules.arith import round_up

LayerDict = dict[str, object]

DERIVED_SPECS = frozenset({"HiSparseResidentSpec", "HiSparseHotSpec"})
"""Specs HiSparse derives from the MLA layers; vLLM lays them out again, so they are skipped."""

NEUTRAL_FIELDS = (
    "kv_quant_mode", "max_tp_shards", "non_causal", "mamba_type", "mamba_cache_mode",
    "tp_replicated", "non_causal_multi_token_decode", "kv_head_major_slots",
)
"""Fields that move no byte but take part in vLLM's spec equality. (A Mamba spec's
`mamba_cache_mode` copies the engine's `cache_config.mamba_cache_mode`, which the request carries
as `model.mamba_cache_mode`; vLLM sizes by the engine's.)"""


@dataclass(frozen=True, slots=True)
class _Reader:
    """One vLLM spec, read with messages that name its layer."""

    name: str
    spec: VllmObject

    @property
    def where(self) -> str:
        return f"layers[{self.name!r}]"

    @property
    def type_name(self) -> str:
        return type(self.spec).__name__

    def get(self, field: str, default: VllmObject = None) -> VllmObject:
        return getattr(self.spec, field, default)

    def refuse(self, field: str, value: VllmObject, why: str) -> UnsupportedRequestError:
        return UnsupportedRequestError(
            f"{self.where}: vLLM {self.type_name}.{field} = {value!r} {why}; the request "
            "contract cannot express it",
            field=self.where,
        )

    def require(self, field: str, allowed: tuple[VllmObject, ...], why: str) -> None:
        value = self.get(field)
        if value not in allowed:
            raise self.refuse(field, value, f"(expected {' or '.join(map(repr, allowed))}) {why}")

    def dtype(self, field: str = "dtype", value: VllmObject = None) -> str:
        raw = self.get(field) if value is None else value
        name = str(raw).removeprefix("torch.")
        if name not in DTYPE_SIZE:
            raise self.refuse(field, raw, f"is not one of {', '.join(DTYPE_SIZE)}")
        return name

    def compress_ratio(self) -> int:
        ratio = self.get("tokens_per_state", 1)
        if isinstance(ratio, Fraction) and ratio.denominator == 1:
            ratio = int(ratio)
        if not isinstance(ratio, int) or isinstance(ratio, bool) or ratio < 1:
            raise self.refuse("tokens_per_state", ratio, "is not a whole number of tokens >= 1")
        return ratio

    def block_stride_alignment(self) -> int | None:
        value = self.get("block_stride_alignment")
        if value is not None and not isinstance(value, int):
            raise self.refuse(
                "block_stride_alignment", value,
                "is given in kernel blocks (kernel-block splitting is deferred, see "
                "docs/planning-rules.md#deferred-modes)",
            )
        return value


def _attention_common(reader: _Reader) -> None:
    reader.require("num_head_slots", (None,), "(packed head slots)")
    stride = reader.get("block_stride_alignment")
    if stride is not None:
        reader.block_stride_alignment()


def _dcp_sharded(reader: _Reader) -> bool | None:
    """vLLM's `AttentionSpec.dcp_sharded` (default True): written only when False."""
    sharded = reader.get("dcp_sharded", True)
    if not isinstance(sharded, bool):
        raise reader.refuse("dcp_sharded", sharded, "is not a bool")
    return None if sharded else False


def _kv_layer(reader: _Reader, kind: str) -> LayerDict:
    """full_attention, sliding_window, chunked_local_attention: separate K and V rows."""
    _attention_common(reader)
    reader.require("state_content_bytes", (None,), "on a K/V layer")
    if reader.compress_ratio() != 1:
        raise reader.refuse("tokens_per_state", reader.get("tokens_per_state"), "on a K/V layer")
    layer: LayerDict = {
        "kind": kind,
        "block_size": reader.get("block_size"),
        "num_kv_heads": reader.get("num_kv_heads"),
        "head_size": reader.get("head_size"),
        "head_size_v": reader.get("head_size_v"),
        "dtype": reader.dtype(),
        "block_stride_alignment": reader.block_stride_alignment(),
        "page_size_padded": reader.get("page_size_padded"),
        "dcp_sharded": _dcp_sharded(reader),
    }
    return layer


def _latent_layer(reader: _Reader, kind: str) -> LayerDict:
    """mla and sliding_window_mla: one latent vector per stored state."""
    _attention_common(reader)
    reader.require("head_size_v", (0,), "(MLA stores one latent vector)")
    heads = reader.get("num_kv_heads")
    block_size = reader.get("block_size")
    ratio = reader.compress_ratio()
    dtype = reader.dtype()
    content = reader.get("state_content_bytes") or reader.get("head_size") * DTYPE_SIZE[dtype]
    natural = heads * (block_size // ratio) * content
    alignment = reader.get("alignment")
    aligned = None if alignment is None else round_up(natural, alignment)
    if aligned == natural:
        aligned = None
    padded = reader.get("page_size_padded")
    return {
        "kind": kind,
        "block_size": block_size,
        "head_size": reader.get("head_size"),
        "dtype": dtype,
        "num_kv_heads": heads,
        "cache_dtype": reader.get("cache_dtype_str"),
        "state_content_bytes": reader.get("state_content_bytes"),
        "model_version": reader.get("model_version"),
        "compress_ratio": ratio,
        "alignment": alignment,
        "block_stride_alignment": reader.block_stride_alignment(),
        # vLLM stores the alignment padding in page_size_padded; only other padding is news.
        "page_size_padded": None if padded == aligned else padded,
        "dcp_sharded": _dcp_sharded(reader),
    }


def _mla(reader: _Reader, extra_tokens: int) -> LayerDict:
    del extra_tokens
    reader.require("attention_chunk_size", (None,), "on an MLA layer")
    role = reader.get("cache_role")
    layer = _latent_layer(reader, "mla")
    # Set on a sliding_window_mla layer vLLM promoted to full allocation.
    layer["sliding_window"] = reader.get("sliding_window")
    layer["cache_role"] = getattr(role, "value", role)
    layer["is_index_group_leader"] = reader.get("is_index_group_leader")
    layer["topk_buffer_width"] = reader.get("topk_buffer_width")
    return layer


def _window_tokens(reader: _Reader, extra_tokens: int) -> None:
    """vLLM's engine tags sliding windows with the drafter's extra tokens before grouping; the
    request carries them once, as scheduler.num_prefill_lookahead_tokens."""
    retained = reader.get("extra_retained_tokens", 0)
    if retained not in (0, extra_tokens):
        raise reader.refuse(
            "extra_retained_tokens", retained,
            f"(expected 0 or {extra_tokens} = num_prefill_lookahead_tokens - 1)",
        )


def _sliding_window_mla(reader: _Reader, extra_tokens: int) -> LayerDict:
    _window_tokens(reader, extra_tokens)
    reader.require("bounded_replay", (False,), "(bounded replay)")
    layer = _latent_layer(reader, "sliding_window_mla")
    layer["sliding_window"] = reader.get("sliding_window")
    return layer


def _full_attention(reader: _Reader, extra_tokens: int) -> LayerDict:
    del extra_tokens
    layer = _kv_layer(reader, "full_attention")
    # Set on a sliding-window or chunked-local layer vLLM promoted to full allocation.
    layer["sliding_window"] = reader.get("sliding_window")
    layer["attention_chunk_size"] = reader.get("attention_chunk_size")
    return layer


def _sliding_window(reader: _Reader, extra_tokens: int) -> LayerDict:
    _window_tokens(reader, extra_tokens)
    layer = _kv_layer(reader, "sliding_window")
    layer["sliding_window"] = reader.get("sliding_window")
    return layer


def _chunked(reader: _Reader, extra_tokens: int) -> LayerDict:
    del extra_tokens
    layer = _kv_layer(reader, "chunked_local_attention")
    layer["attention_chunk_size"] = reader.get("attention_chunk_size")
    return layer


def _cross_attention(reader: _Reader, extra_tokens: int) -> LayerDict:
    """An encoder-decoder model's cross-attention layer (Whisper's `encoder_attn`)."""
    del extra_tokens
    return _kv_layer(reader, "cross_attention")


def _mamba(reader: _Reader, extra_tokens: int) -> LayerDict:
    del extra_tokens
    reader.require("num_heads", (1,), "(state heads)")
    reader.require("tokens_per_state", (-1,), "(Mamba stores one state per request)")
    shapes = [list(shape) for shape in reader.get("shapes")]
    dtypes = [reader.dtype("dtypes", dtype) for dtype in reader.get("dtypes")]
    # 0.33's MambaSpec has no state_alignment (its states are unaligned, i.e. 1); the 7.13
    # fields are written only when they differ from the contract's defaults.
    state_alignment = reader.get("state_alignment", 1)
    checkpoints = reader.get("num_prefill_checkpoint_blocks", 0)
    return {
        "kind": "mamba",
        "block_size": reader.get("block_size"),
        "state_shapes": shapes,
        "state_dtypes": dtypes,
        "page_size_padded": reader.get("page_size_padded"),
        "num_speculative_blocks": reader.get("num_speculative_blocks"),
        "block_stride_alignment": reader.block_stride_alignment(),
        "state_alignment": None if state_alignment == 1 else state_alignment,
        "num_prefill_checkpoint_blocks": None if checkpoints == 0 else checkpoints,
        "prefill_checkpoint_alignment": reader.get("prefill_checkpoint_alignment"),
    }


_MAPPERS: dict[str, Callable[[_Reader, int], LayerDict]] = {
    "MLAAttentionSpec": _mla,
    "SlidingWindowMLASpec": _sliding_window_mla,
    "FullAttentionSpec": _full_attention,
    "SlidingWindowSpec": _sliding_window,
    "ChunkedLocalAttentionSpec": _chunked,
    "CrossAttentionSpec": _cross_attention,
    "MambaSpec": _mamba,
}
SUPPORTED_SPECS = tuple(_MAPPERS)


def layer_dicts(specs: Mapping[str, VllmObject], extra_tokens: int) -> dict[str, LayerDict]:
    """The request's `layers` for vLLM's `dict[str, KVCacheSpec]`, in the same order.

    `extra_tokens` is max(0, num_prefill_lookahead_tokens - 1): a sliding window that already
    carries it (vLLM tags them before grouping) maps to the same layer as one that does not.
    Derived HiSparse specs are skipped; any other spec vLLM has and the contract lacks is refused.
    """
    layers: dict[str, LayerDict] = {}
    neutral: dict[tuple[str, str], tuple[str, VllmObject]] = {}
    # Equal specs (vLLM's equality: same class, same compared fields, which include the neutral
    # ones) map to one dict, read once: a model repeats a few specs over all its layers.
    mapped: dict[VllmObject, LayerDict] = {}
    for name, spec in specs.items():
        try:
            layer = mapped.get(spec)
        except TypeError:  # an unhashable spec: read it on its own
            layer = None
        if layer is not None:
            layers[name] = layer
            continue
        reader = _Reader(name, spec)
        if reader.type_name in DERIVED_SPECS:
            continue
        mapper = _MAPPERS.get(reader.type_name)
        if mapper is None:
            raise UnsupportedRequestError(
                f"{reader.where}: vLLM spec type {reader.type_name} is not supported; expected "
                f"one of {', '.join(SUPPORTED_SPECS)}",
                field=reader.where,
            )
        layers[name] = {key: value for key, value in mapper(reader, extra_tokens).items()
                        if value is not None}
        _check_neutral(reader, neutral)
        with contextlib.suppress(TypeError):
            mapped[spec] = layers[name]
    return layers


def _check_neutral(reader: _Reader, seen: dict[tuple[str, str], tuple[str, VllmObject]]) -> None:
    for field in NEUTRAL_FIELDS:
        if not hasattr(reader.spec, field):
            continue
        value = reader.get(field)
        first = seen.setdefault((reader.type_name, field), (reader.name, value))
        if first[1] != value:
            raise UnsupportedRequestError(
                f"{reader.where}: vLLM {reader.type_name}.{field} is {value!r} but "
                f"{first[0]!r} has {first[1]!r}; the request contract cannot tell such layers "
                "apart, so expected one value per spec type",
                field=reader.where,
            )
