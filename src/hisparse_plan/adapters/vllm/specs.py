"""hisparse_plan specs as vLLM 0.33 / 0.34 spec objects (vLLM and torch imported when called).

A rebuilt spec takes every field the contract has from our spec. When the engine's own spec of
that layer is at hand, the fields the contract lacks (quantization mode, TP shards, draft flag,
...) are carried over from it, and the original object itself is returned when nothing changed,
so a vLLM consumer sees the spec objects it handed in.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping

from hisparse_plan.adapters.vllm.layers import NEUTRAL_FIELDS
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import PlanError
from hisparse_plan.models import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    GroupSpec,
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCacheGroup,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeSpec,
)

INTERFACE = "vllm.v1.kv_cache_interface"
CARRIED_FIELDS = (*NEUTRAL_FIELDS, "is_draft")


def interface() -> VllmObject:
    """vllm.v1.kv_cache_interface, imported on first use."""
    return importlib.import_module(INTERFACE)


def _torch_dtype(name: str) -> VllmObject:
    return getattr(importlib.import_module("torch"), name)


def _mamba_spec(
    spec: MambaSpec, mamba_cache_mode: str, common: dict[str, VllmObject]
) -> VllmObject:
    kv = interface()
    state_alignment = spec.state_alignment
    if state_alignment != 1:
        if "state_alignment" not in {field.name for field in dataclasses.fields(kv.MambaSpec)}:
            raise PlanError(
                f"state_alignment: this vLLM's MambaSpec has no state_alignment (vLLM 0.34 has "
                f"it); expected 1, got {state_alignment}",
                field="state_alignment",
            )
        common["state_alignment"] = state_alignment
    return kv.MambaSpec(
        shapes=tuple(tuple(shape) for shape in spec.state_shapes),
        dtypes=tuple(_torch_dtype(dtype) for dtype in spec.state_dtypes),
        page_size_padded=spec.page_size_padded,
        num_speculative_blocks=spec.num_speculative_blocks,
        num_prefill_checkpoint_blocks=spec.num_prefill_checkpoint_blocks,
        prefill_checkpoint_alignment=spec.prefill_checkpoint_alignment,
        mamba_cache_mode=mamba_cache_mode,
        **common,
    )


def fresh_layer_spec(
    spec: LayerSpec, extra_tokens: int, mamba_cache_mode: str = "none"
) -> VllmObject:
    """The vLLM spec of one layer, from the contract's fields alone (vLLM defaults elsewhere).
    A Mamba spec copies the engine's `mamba_cache_mode`, as vLLM's model layers do."""
    kv = interface()
    common: dict[str, VllmObject] = {"block_size": spec.block_size}
    if spec.block_stride_alignment is not None:
        common["block_stride_alignment"] = spec.block_stride_alignment
    if isinstance(spec, MambaSpec):
        return _mamba_spec(spec, mamba_cache_mode, common)
    common.update(
        num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
        dtype=_torch_dtype(spec.dtype), page_size_padded=spec.page_size_padded,
        dcp_sharded=spec.dcp_sharded,
    )
    if isinstance(spec, MLASpec | SlidingWindowMLASpec):
        common.update(
            cache_dtype_str=spec.cache_dtype, state_content_bytes=spec.state_content_bytes,
            model_version=spec.model_version, tokens_per_state=spec.compress_ratio,
            alignment=spec.alignment,
        )
        if isinstance(spec, SlidingWindowMLASpec):
            return kv.SlidingWindowMLASpec(
                sliding_window=spec.sliding_window, extra_retained_tokens=extra_tokens, **common
            )
        return kv.MLAAttentionSpec(
            sliding_window=spec.sliding_window,
            cache_role=kv.SparseCacheRole(spec.cache_role),
            is_index_group_leader=spec.is_index_group_leader,
            topk_buffer_width=spec.topk_buffer_width,
            **common,
        )
    common["head_size_v"] = spec.head_size_v
    if isinstance(spec, SlidingWindowSpec):
        return kv.SlidingWindowSpec(
            sliding_window=spec.sliding_window, extra_retained_tokens=extra_tokens, **common
        )
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return kv.ChunkedLocalAttentionSpec(
            attention_chunk_size=spec.attention_chunk_size, **common
        )
    if isinstance(spec, CrossAttentionSpec):
        return kv.CrossAttentionSpec(**common)
    if isinstance(spec, FullAttentionSpec):
        return kv.FullAttentionSpec(
            sliding_window=spec.sliding_window, attention_chunk_size=spec.attention_chunk_size,
            **common,
        )
    raise TypeError(f"no vLLM spec for {type(spec).__name__}")


class SpecBuilder:
    """The vLLM specs of one plan's layers and groups (one conversion): each distinct pair of
    our spec and engine spec is converted once, and layers alike share the result.

    `originals` is the engine's own `dict[str, KVCacheSpec]` (or None); `extra_tokens` the
    sliding windows' extra retained tokens; `mamba_cache_mode` the engine's, which vLLM's Mamba
    specs copy."""

    def __init__(
        self,
        extra_tokens: int,
        originals: Mapping[str, VllmObject] | None,
        mamba_cache_mode: str = "none",
    ) -> None:
        self.extra_tokens = extra_tokens
        self.originals = originals
        self.mamba_cache_mode = mamba_cache_mode
        self._fresh: dict[int, VllmObject] = {}
        # Per our spec (by identity: equal specs are one object in a plan), the engine specs
        # seen with it, each with what it became: itself when unchanged, else the rebuilt spec.
        self._seen: dict[int, list[tuple[VllmObject, tuple[VllmObject, ...], VllmObject]]] = {}
        self._keep: list[LayerSpec] = []  # holds the specs whose ids key the caches
        self._uncompared_of: dict[type, tuple[str, ...]] = {}

    def _uncompared(self, original: VllmObject) -> tuple[str, ...]:
        """The carried fields that `==` on specs of this class does not look at."""
        names = self._uncompared_of.get(type(original))
        if names is None:
            fields = {field.name: field.compare for field in dataclasses.fields(original)}
            # A field the class lacks is absent from all its specs alike: nothing to compare.
            names = tuple(name for name in CARRIED_FIELDS if fields.get(name) is False)
            self._uncompared_of[type(original)] = names
        return names

    def fresh(self, spec: LayerSpec) -> VllmObject:
        built = self._fresh.get(id(spec))
        if built is None:
            built = self._fresh[id(spec)] = fresh_layer_spec(
                spec, self.extra_tokens, self.mamba_cache_mode)
            self._keep.append(spec)
        return built

    def layer(self, name: str, spec: LayerSpec) -> VllmObject:
        """The vLLM spec of layer `name`, keeping what the engine's own spec says beyond ours."""
        original = None if self.originals is None else self.originals.get(name)
        if original is None:
            return self.fresh(spec)
        # Carried fields outside vLLM's spec equality (is_draft) are compared on their own.
        carried = tuple(getattr(original, field, _ABSENT) for field in self._uncompared(original))
        seen = self._seen.get(id(spec))
        if seen is None:
            seen = self._seen[id(spec)] = []
        for engine_spec, engine_carried, became in seen:
            if engine_spec == original and engine_carried == carried:
                return original if became is engine_spec else became
        became = _with_carried(self.fresh(spec), original)
        seen.append((original, carried, became))
        return became

    def group_spec(self, group: KVCacheGroup) -> VllmObject:
        """The spec vLLM gives this group: derived HiSparse specs, a UniformTypeKVCacheSpecs of
        the members, or the merge (vLLM's own `merge`) of the layers' equal specs."""
        kv = interface()
        spec: GroupSpec = group.spec
        if isinstance(spec, HisparseResidentSpec):
            return kv.HiSparseResidentSpec(
                block_size=spec.block_size, page_size=spec.page_size_bytes)
        if isinstance(spec, HisparseHotSpec):
            return kv.HiSparseHotSpec(
                block_size=spec.block_size, page_size=spec.page_size_bytes,
                blocks_per_request=spec.blocks_per_request,
            )
        if isinstance(spec, UniformTypeSpec):
            return kv.UniformTypeKVCacheSpecs(
                block_size=spec.block_size,
                kv_cache_specs={
                    name: self.layer(name, member) for name, member in spec.specs.items()
                },
            )
        layers = [self.layer(name, spec) for name in group.layer_names]
        return layers[0].merge(layers)

    def group(self, group: KVCacheGroup) -> VllmObject:
        """vLLM's KVCacheGroupSpec for one plan group."""
        kv = interface()
        return kv.KVCacheGroupSpec(
            list(group.layer_names),
            self.group_spec(group),
            host_resident=group.host_resident,
            enable_kv_transfer=group.enable_kv_transfer,
            role=kv.KVCacheGroupRole(group.role),
        )


_ABSENT = object()
"""An engine spec's value for a carried field its class does not have."""


def _with_carried(fresh: VllmObject, original: VllmObject) -> VllmObject:
    """`fresh` with the engine's values of the fields the contract lacks; `original` itself
    when that changes nothing."""
    fresh_fields = {field.name for field in dataclasses.fields(fresh)}
    carried = {
        field: getattr(original, field)
        for field in CARRIED_FIELDS
        if field in fresh_fields and hasattr(original, field)
    }
    rebuilt = dataclasses.replace(fresh, **carried)
    if type(rebuilt) is type(original) and rebuilt == original:
        return original
    return rebuilt


def group_spec(
    group: KVCacheGroup,
    extra_tokens: int,
    originals: Mapping[str, VllmObject] | None,
    mamba_cache_mode: str = "none",
) -> VllmObject:
    """The spec vLLM gives this group (see `SpecBuilder.group_spec`)."""
    return SpecBuilder(extra_tokens, originals, mamba_cache_mode).group_spec(group)


def group(
    group: KVCacheGroup,
    extra_tokens: int,
    originals: Mapping[str, VllmObject] | None,
    mamba_cache_mode: str = "none",
) -> VllmObject:
    """vLLM's KVCacheGroupSpec for one plan group."""
    return SpecBuilder(extra_tokens, originals, mamba_cache_mode).group(group)
