"""A vLLM plan's Mamba states, each viewed in its own dtype: the alignment vLLM's binding needs."""

from __future__ import annotations

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import GroupSpec, MambaSpec
from hisparse_plan.targets.vllm.rules.states import misaligned_state
from hisparse_plan.views import LayerView


def check_state_alignment(view: LayerView, spec: GroupSpec) -> None:
    """A Mamba layer's states are viewed each in its own dtype (vLLM's bind_kv_cache), so each
    state's first byte and the block stride must be whole elements of it
    (targets/vllm/rules/states.py)."""
    if not isinstance(spec, MambaSpec):
        return
    state = misaligned_state(spec, view.offset, view.block_stride)
    if state is not None:
        raise PlanInvariantError(
            f"tensors[{view.tensor}] layer {view.name!r}: state {state.index} ({state.dtype}) "
            f"starts at byte {view.offset + state.start} ({state.start} into the page) with "
            f"blocks {view.block_stride} bytes apart; expected both multiples of the "
            f"{state.dtype} size {state.itemsize}",
            tensor=view.tensor, layer=view.name,
        )
