"""What each of SGLang's pools is (docs/plan-contract.md#sglang-plans): the pool names SGLang
0.5.23's classes give, each with the one role it plays, so that no pool escapes the checks of
its role by another name or place.

A role fixes where the pool lives and how it is allocated, as SGLang's classes allocate it:
token pools (MHA, latent, index keys, DeepSeek-V4's paged pools and compressor states) are one
device buffer per layer; Mamba states one layer-first device buffer per state; HiSparse's copy
of the latent pool one pinned, layer-first host buffer. It also fixes the tokens a block holds,
from the page size, and whether it may be shared (a host pool only, which tensor-parallel ranks
map). Which pools a plan holds follows from its model: every plan has its full pool (`kv`, or
DeepSeek-V4's `v4_swa`), pools that only exist together come together and keep the same layers,
every pool holds a layer, and a pool's tensors carry exactly the buffers SGLang keeps over it
(targets/sglang/buffers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang.buffers import pool_buffers


@dataclass(frozen=True, slots=True)
class PoolRole:
    """Where a pool lives, how it is allocated, and the tokens (or slots) of one block for a
    page of `page_size` tokens."""

    location: Literal["device", "host"]
    allocation: Literal["whole", "per_layer"]
    block_tokens: Callable[[int], int]
    deepseek_v4: bool = False
    padding_blocks: int = 1
    """SGLang's padding page or slot 0; a host pool of DeepSeek-V4's hands out every page."""


def _page(page_size: int) -> int:
    return page_size


def _slot(page_size: int) -> int:
    return 1


def _compressed(ratio: int) -> Callable[[int], int]:
    def tokens(page_size: int) -> int:
        return page_size // ratio

    return tokens


def _ring(rows: int) -> Callable[[int], int]:
    def tokens(page_size: int) -> int:
        return rows

    return tokens


C4_STATE_RING: Final = 8
"""Rows of one c4 compressor-state ring: two overlapping 4-token windows."""
C128_STATE_RING: Final = 128
"""Rows of one c128 compressor-state ring."""

_TOKEN_POOL = PoolRole("device", "per_layer", _page)
DRAFT_POOLS: Final = frozenset({"draft_kv", "draft_kv_v", "draft_index", "draft_swa",
                                "draft_swa_v"})
"""The draft worker's pools (speculative decoding)."""
SGLANG_POOL_ROLES: Final[dict[str, PoolRole]] = {
    "kv": _TOKEN_POOL,
    "kv_v": _TOKEN_POOL,
    "swa": _TOKEN_POOL,
    "swa_v": _TOKEN_POOL,
    "index": _TOKEN_POOL,
    "draft_kv": _TOKEN_POOL,
    "draft_kv_v": _TOKEN_POOL,
    "draft_index": _TOKEN_POOL,
    "draft_swa": _TOKEN_POOL,
    "draft_swa_v": _TOKEN_POOL,
    "hisparse_host": PoolRole("host", "whole", _page),
    "mamba_conv0": PoolRole("device", "whole", _slot),
    "mamba_temporal": PoolRole("device", "whole", _slot),
    "mamba_intermediate_ssm": PoolRole("device", "whole", _slot),
    "mamba_intermediate_conv0": PoolRole("device", "whole", _slot),
    "v4_swa": PoolRole("device", "per_layer", _page, deepseek_v4=True),
    "v4_c4": PoolRole("device", "per_layer", _compressed(4), deepseek_v4=True),
    "v4_index_c4": PoolRole("device", "per_layer", _compressed(4), deepseek_v4=True),
    "v4_c128": PoolRole("device", "per_layer", _compressed(128), deepseek_v4=True),
    "v4_hisparse_host": PoolRole("host", "per_layer", _compressed(4), deepseek_v4=True,
                                 padding_blocks=0),
    "v4_state_c4": PoolRole("device", "per_layer", _ring(C4_STATE_RING), deepseek_v4=True),
    "v4_index_state_c4": PoolRole(
        "device", "per_layer", _ring(C4_STATE_RING), deepseek_v4=True),
    "v4_state_c128": PoolRole("device", "per_layer", _ring(C128_STATE_RING), deepseek_v4=True),
}
"""Every pool SGLang 0.5.23 allocates for the models planned, by the name the plan gives it."""

_TOGETHER: Final[tuple[tuple[str, ...], ...]] = (
    ("mamba_conv0", "mamba_temporal"),
    ("mamba_intermediate_ssm", "mamba_intermediate_conv0"),
    ("v4_c4", "v4_index_c4", "v4_state_c4", "v4_index_state_c4"),
    ("v4_c128", "v4_state_c128"),
)
"""Pools one model feature allocates together: all of a row, or none."""
_NEEDS: Final[dict[str, str]] = {
    "kv_v": "kv", "swa_v": "swa", "index": "kv", "hisparse_host": "index",
    "draft_kv": "kv", "draft_kv_v": "draft_kv", "draft_index": "draft_kv",
    "draft_swa": "swa", "draft_swa_v": "draft_swa",
    "mamba_intermediate_ssm": "mamba_conv0",
    "v4_hisparse_host": "v4_c4",
}
"""A pool that only exists beside another: V beside K, index keys beside the latent pool,
HiSparse's host pool beside a DSA model's index keys."""
_SAME_LAYERS: Final[tuple[tuple[str, str], ...]] = (
    ("kv", "kv_v"), ("swa", "swa_v"), ("mamba_conv0", "mamba_temporal"),
    ("kv", "hisparse_host"), ("draft_kv", "draft_kv_v"), ("draft_kv", "draft_index"),
    ("draft_swa", "draft_swa_v"),
    ("mamba_conv0", "mamba_intermediate_ssm"), ("mamba_conv0", "mamba_intermediate_conv0"),
    ("v4_c4", "v4_hisparse_host"),
)
"""Pools that keep parts of the same layers: a layer's K and V, a Mamba layer's two states, a
latent layer's rows on the GPU and on the host."""


def check_pool_role(pool: Pool, page_size: int) -> PoolRole:
    """The pool is one of SGLang's, of the one pipeline stage, where its role keeps it,
    allocated as its role allocates it, holding its role's tokens a block; its role."""
    role = SGLANG_POOL_ROLES.get(pool.name)
    if role is None:
        raise PlanInvariantError(
            f"pool {pool.name!r} is none of SGLang's pools; expected one of "
            f"{sorted(SGLANG_POOL_ROLES)}"
        )
    if pool.stage != 0:
        raise PlanInvariantError(
            f"pool {pool.name!r} is of pipeline stage {pool.stage}; expected 0 (SGLang's plans "
            "are one stage)"
        )
    got = (pool.location, pool.allocation, pool.block_tokens)
    want = (role.location, role.allocation, role.block_tokens(page_size))
    if got != want:
        raise PlanInvariantError(
            f"pool {pool.name!r} is a {got[0]} pool allocated {got[1]} holding {got[2]} tokens "
            f"a block; expected {want[0]}, {want[1]}, {want[2]} (SGLang's {pool.name} pool for "
            f"{page_size}-token pages)"
        )
    _check_sharing(pool, role)
    return role


def _check_sharing(pool: Pool, role: PoolRole) -> None:
    """Only a host pool may be shared (tensor-parallel ranks on one host map it); every
    device pool is its rank's own."""
    if pool.shared and role.location != "host":
        raise PlanInvariantError(
            f"pool {pool.name!r} has shared true; expected false (only a host pool is shared "
            f"between ranks, and SGLang's {pool.name} pool is on the device)"
        )


def window_only_rank(plan: SGLangPlan, pools: dict[str, Pool]) -> bool:
    """A pipeline rank of a window hybrid that keeps window layers only: SGLang builds its
    window pool alone, holding max_total_num_tokens (its all-window configurator)."""
    return plan.pipeline is not None and "swa" in pools and "kv" not in pools


def mamba_only_rank(plan: SGLangPlan, pools: dict[str, Pool]) -> bool:
    """A pipeline rank of Mamba layers only: SGLang's KV pool there has no layer (no pool in
    the plan), its Mamba pools are all there is."""
    return plan.pipeline is not None and all(name.startswith("mamba") for name in pools)


def token_pool(plan: SGLangPlan, pools: dict[str, Pool]) -> str | None:
    """The pool that holds max_total_num_tokens: DeepSeek-V4's window pool, a window-only
    pipeline rank's window pool, none on a Mamba-only rank, else the full pool."""
    if plan.deepseek_v4 is not None:
        return "v4_swa"
    if mamba_only_rank(plan, pools):
        return None
    return "swa" if window_only_rank(plan, pools) else "kv"


def check_pool_roles(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """Every pool in its role; the full pool present; the model's pools all or none; the host
    pool exactly when HiSparse is on, and the DeepSeek-V4 pools exactly for its figures."""
    v4 = plan.deepseek_v4 is not None
    for pool in pools.values():
        # A draft pool under decode context parallelism pages every rank's ids.
        page = plan.page_size * (plan.budget.dcp_size if pool.name in DRAFT_POOLS else 1)
        role = check_pool_role(pool, page)
        if role.deepseek_v4 != v4:
            raise PlanInvariantError(
                f"pool {pool.name!r} is {'' if role.deepseek_v4 else 'not '}a DeepSeek-V4 pool "
                f"in a plan {'with' if v4 else 'without'} deepseek_v4 figures; expected "
                "DeepSeek-V4's pools exactly with its figures"
            )
    full = token_pool(plan, pools)
    if full is not None and full not in pools:
        raise PlanInvariantError(
            f"the plan has no pool {full!r}; expected SGLang's full pool, which holds "
            "max_total_num_tokens"
        )
    if window_only_rank(plan, pools) and plan.page_size != 1:
        raise PlanInvariantError(
            f"the plan keeps a window pool without a full one (a pipeline rank of window "
            f"layers only) at page_size {plan.page_size}; expected 1 (SGLang's all-window "
            "allocator takes one-token pages only)"
        )
    for names in _TOGETHER:
        present = [name for name in names if name in pools]
        if present and len(present) != len(names):
            raise PlanInvariantError(
                f"the plan has pools {present} of {list(names)}; expected all of them or none "
                "(SGLang allocates them together)"
            )
    for name, beside in _NEEDS.items():
        if name in pools and beside not in pools:
            raise PlanInvariantError(
                f"the plan has pool {name!r} without {beside!r}; expected it only beside it"
            )
    hosted = "hisparse_host" in pools or "v4_hisparse_host" in pools
    if hosted != (plan.hisparse is not None):
        raise PlanInvariantError(
            f"the plan {'has' if hosted else 'has no'} hisparse_host pool and hisparse "
            f"{'null' if plan.hisparse is None else 'figures'}; expected the host pool exactly "
            "with HiSparse"
        )


def check_layer_sets(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """Every pool holds at least one layer (SGLang allocates no pool for none), and pools that
    keep parts of the same layers keep the same ones."""
    layers: dict[str, set[str]] = {name: set() for name in pools}
    for tensor in plan.tensors:
        layers[tensor.pool].update(tensor.layers)
    for name, held in layers.items():
        if not held:
            raise PlanInvariantError(
                f"pool {name!r} holds no layer (no tensor names it); expected every pool to "
                "hold a layer's buffers"
            )
    for first, second in _SAME_LAYERS:
        if first in layers and second in layers and layers[first] != layers[second]:
            odd = sorted(layers[first] ^ layers[second])[0]
            raise PlanInvariantError(
                f"pool {second!r} holds layers {sorted(layers[second])} and pool {first!r} "
                f"{sorted(layers[first])} ({odd!r} in one only); expected the same layers "
                "(SGLang allocates them for the same layers)", layer=odd,
            )


def check_view_names(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """Each tensor's views are the buffers SGLang keeps over its pool, one a page range in
    range order (targets/sglang/buffers.py): no buffer SGLang lacks, none missing."""
    for index, tensor in enumerate(plan.tensors):
        names = tuple(view.name for view in tensor.views)
        expected = pool_buffers(tensor.pool, pools)
        if names not in expected:
            choices = " or ".join(str(list(one)) for one in expected)
            raise PlanInvariantError(
                f"tensors[{index}] of pool {tensor.pool!r} has views {list(names)}; expected "
                f"{choices} (the buffers SGLang keeps over that pool)",
                tensor=index, layer=tensor.layers[0],
            )


def block_bytes(plan: SGLangPlan) -> dict[str, int]:
    """Bytes one block of each pool takes over all its layers (its page ranges, a layer
    each)."""
    found: dict[str, int] = {}
    for tensor in plan.tensors:
        page = sum(part.size for part in tensor.ranges or [])
        found[tensor.pool] = found.get(tensor.pool, 0) + page * len(tensor.layers)
    return found
