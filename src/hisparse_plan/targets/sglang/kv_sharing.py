"""Cross-layer KV sharing as SGLang 0.5.23 lays it out (see
docs/planning-rules.md#cross-layer-kv-sharing).

SGLang's `gemma3n_causal.py` gives a sharing layer's `RadixAttention` its target's `layer_id`
and saves no KV for it, so it reads the target's buffers; but the KV pool is sized and built
for every layer (`num_effective_layers`, the decoder layers of the stage), so the sharing
layers keep buffers of their own that nothing writes. The plan lays them out as SGLang does,
every layer in the pool, and says which bytes are never written.
"""

from __future__ import annotations

from hisparse_plan.models.base import FrozenList
from hisparse_plan.models.kv_sharing import shared_layers
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.trace import Trace


def note_unwritten_buffers(request: PlanRequest, plan: SGLangPlan, trace: Trace) -> SGLangPlan:
    """The plan with a warning naming the sharing layers whose buffers SGLang allocates and
    never writes; the plan itself when no layer shares."""
    sharing = shared_layers(request.layers)
    if not sharing:
        return plan
    names = list(sharing)
    targets = sorted(set(sharing.values()), key=list(request.layers).index)
    note = (
        f"{len(names)} of {len(request.layers)} layers ({names[0]!r} to {names[-1]!r}) read "
        f"the KV buffers of {', '.join(map(repr, targets))} (SGLang's RadixAttention gets the "
        "target's layer_id), yet SGLang 0.5.23 allocates buffers for every layer: theirs are "
        "never written"
    )
    trace.add("report", "sglang.pools", "warnings", len(names), note)
    return plan.model_copy(update={"warnings": FrozenList([*plan.warnings, note])})
