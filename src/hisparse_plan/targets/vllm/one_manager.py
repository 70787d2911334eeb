"""The hybrid KV cache manager disabled (SPEC 7.13): before grouping, local-attention layers
are promoted to full allocation, as vLLM's `unify_hybrid_kv_cache_specs` does, so that one
manager can serve every layer. Replicated (not DCP-sharded) attention layers and the rest are
promoted separately; a set that still is neither one spec nor one family is refused."""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.errors import PlanError
from hisparse_plan.models import FullAttentionSpec, LayerSpec, MambaSpec, MLASpec
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import Layer, first_of_each_spec
from hisparse_plan.targets.vllm.rules.families import one_family
from hisparse_plan.targets.vllm.rules.promotion import is_local, promote_local_layers
from hisparse_plan.targets.vllm.rules.uniform_spec import merged_spec, refuse_mixed_windows

FIELD = "scheduler.disable_hybrid_kv_cache_manager"


def one_manager_layers(layers: Sequence[Layer], trace: Trace) -> list[Layer]:
    """`layers` (request order) as one KV cache manager plans them."""
    parts: dict[bool, list[Layer]] = {}
    for name, spec in layers:
        replicated = not isinstance(spec, MambaSpec) and not spec.dcp_sharded
        parts.setdefault(replicated, []).append((name, spec))
    promoted: dict[str, LayerSpec] = {}
    for part in parts.values():
        promoted.update(_promote_part(part, trace))
    return [(name, promoted.get(name, spec)) for name, spec in layers]


def _promote_part(part: list[Layer], trace: Trace) -> dict[str, LayerSpec]:
    # vLLM tests the part as one spec before promoting it and again after; either test can
    # refuse a mix of windows or chunks (`refuse_mixed_windows`).
    refuse_mixed_windows(part, FIELD)
    if _one_manager_can_plan([spec for _, spec in part]):
        return {}
    specs = [spec for _, spec in part]
    has_full = any(isinstance(spec, FullAttentionSpec | MLASpec) for spec in specs)
    result = list(part)
    if has_full and any(is_local(spec) for spec in specs):
        result, count = promote_local_layers(part)
        trace.add("group", "7.13", "layers promoted to full allocation", count,
                  lambda: f"{FIELD}: local-attention layers take a block for every token")
    refuse_mixed_windows(result, FIELD)
    if not _one_manager_can_plan([spec for _, spec in result]):
        (first, first_spec), (other, other_spec) = first_of_each_spec(result)[:2]
        raise PlanError(
            f"{FIELD}: with the hybrid KV cache manager disabled every layer must become one spec "
            f"or one family, but {first!r} ({first_spec.kind}) and {other!r} ({other_spec.kind}) "
            "cannot share one manager even with local-attention layers given full blocks; "
            "expected the hybrid manager on (false) for this model",
            field=FIELD,
        )
    return {name: new for (name, old), (_, new) in zip(part, result, strict=True) if new is not old}


def _one_manager_can_plan(specs: list[LayerSpec]) -> bool:
    distinct = list({id(spec): spec for spec in specs}.values())
    return merged_spec(distinct) is not None or one_family(distinct)
