"""A draft of its own shape against the budget, as SGLang 0.5.23 lets it pass.

SGLang's target configurator prices each draft layer at the target's per-layer bytes
(`DefaultPoolConfigurator.__init__`: `int(cell_size * eagle_draft_num_layers / num_layers)`,
its comment: "assumes the draft shares the target's per-layer KV size"), while the draft worker
(`EAGLEWorkerV2` -> `ModelRunner.alloc_memory_pool` -> `KVCacheConfigurator(is_draft_worker=
True)`) builds its pools from the draft's own config: its heads and head_dim. A draft wider
than the target therefore takes more than the budget paid for it. The plan keeps SGLang's
figures and states the excess (`speculative.draft_beyond_budget_bytes`) and a warning; the
report stage refuses any other way past the budget (`refuse_past_budget`)."""

from __future__ import annotations

from typing import Final

from hisparse_plan.errors import PlanInvariantError, UnsupportedRequestError
from hisparse_plan.targets.sglang.layout import Placed

FULL_DRAFT_POOLS: Final = ("draft_kv", "draft_kv_v", "draft_index")
"""The draft worker's pools priced in the full part of the target's cell."""


def draft_beyond_budget(placed: Placed, draft_cell_bytes: int, page: int, scale: int) -> int:
    """Bytes the draft's full pools take beyond their price: their blocks (padding aside)
    times what one block of every draft layer takes over what the price pays a draft block
    (`draft_cell_bytes` a target token, which stands for `scale` draft token ids)."""
    draft = next((pool for pool in placed.pools if pool.name == "draft_kv"), None)
    if draft is None:
        return 0
    own = sum(sum(part.size for part in tensor.ranges or []) * len(tensor.layers)
              for tensor in placed.tensors if tensor.pool in FULL_DRAFT_POOLS)
    # Under decode context parallelism a draft block holds dcp_size pages of token ids.
    paid = draft_cell_bytes * (draft.block_tokens or page) // scale
    return max(0, own - paid) * (draft.num_blocks - 1)


def beyond_budget_warning(beyond: int, available: int, draft_cell_bytes: int) -> str:
    """The plan's note of a draft past the budget, naming both figures."""
    return (f"the pools pass budget.available_bytes {available} by the draft's {beyond} bytes "
            f"(beside their padding pages): SGLang 0.5.23 charges the budget "
            f"{draft_cell_bytes} bytes a token for the draft (its layers at the target's "
            "per-layer bytes, DefaultPoolConfigurator) while its worker builds the pools in the "
            "draft's own shape; leave that much more device memory free, or use a draft no "
            "wider than the target")


def refuse_draft_past_device(beyond: int, available: int) -> None:
    """A draft whose excess alone is more than the whole budget: the budget is a fraction of
    the device's free memory, so SGLang's draft worker would fail to allocate its pools (a
    config with absurd heads or head_dim is one)."""
    if beyond > available:
        raise UnsupportedRequestError(
            f"engine.speculative_draft_kv_heads: the draft's pools in its own shape (its heads "
            f"and head_dim) take {beyond} bytes more than SGLang charges for them, past the "
            f"whole budget.available_bytes {available}; SGLang's draft worker could not "
            "allocate them; expected a draft whose pools fit beside the target's",
            field="engine.speculative_draft_kv_heads")


def refuse_past_budget(available: int, charged: int, beyond: int) -> None:
    """The planner's own guard: the tokens' cells fit the budget, so the pools pass it by the
    recorded draft excess (and their padding pages) and no more."""
    if charged > available:
        raise PlanInvariantError(
            f"the planned pools charge {charged} bytes to budget.available_bytes {available} "
            f"(the draft's {beyond} beyond it aside); expected at most the budget")
