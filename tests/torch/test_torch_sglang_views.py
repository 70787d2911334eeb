"""verify and check_plan agree on what an SGLang view may reach: a plan of every SGLang pool kind
(DeepSeek-V4's included, whose compressor states keep spare rows past the last page) is
allocated and verified on CPU, and verify still finds a row outside its own page or a spare row
that meets a page."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from test_torch_sglang import hand_plan, run

import hisparse_plan as hp
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.torch import VerifyError, allocate, verify
from support.sglang_cases import TINY, tiny_plan
from support.sglang_hand_plans import HEADS, PAGE, ROW_BYTES, ROWS

SGLANG_POOLS = {
    "kv", "kv_v", "swa", "index", "hisparse_host", "mamba_conv0", "mamba_temporal",
    "v4_swa", "v4_c4", "v4_index_c4", "v4_c128", "v4_state_c4", "v4_index_state_c4",
    "v4_state_c128", "v4_hisparse_host", "draft_kv", "draft_swa",
}
"""The pools SGLang allocates for the models planned (swa_v: a window pool with K and V of
different sizes, which no model planned has; draft_kv and draft_swa: a window draft's)."""


@pytest.mark.parametrize("case", list(TINY))
def test_every_sglang_pool_kind_allocates_and_verifies(case: str) -> None:
    plan = tiny_plan(case)
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        full = verify(plan, pools)
        sample = verify(plan, pools, blocks=2)
    held = {pool.name: pool for pool in plan.pools}
    assert not full.sampled
    assert full.pages == sum(len(t.layers) * len(t.ranges or []) * held[t.pool].num_blocks
                             for t in plan.tensors)
    assert sample.pages <= full.pages


def test_the_kinds_cover_every_sglang_pool() -> None:
    seen = {pool.name for case in TINY for pool in tiny_plan(case).pools}
    assert seen == SGLANG_POOLS


def test_the_deepseek_v4_states_keep_spare_rows_past_every_page() -> None:
    plan = tiny_plan("deepseek_v4")
    spare = {}
    for tensor in plan.tensors:
        pool = next(p for p in plan.pools if p.name == tensor.pool)
        rows = tensor.views[0].shape[0]
        owned = pool.num_blocks if rows < pool.num_blocks * (pool.block_tokens or 1) else (
            pool.num_blocks * (pool.block_tokens or 1))
        spare[pool.name] = rows - owned
    assert spare["v4_state_c4"] > 0
    assert spare["v4_index_state_c4"] > 0
    assert spare["v4_state_c128"] > 0


def _k_buffer_edit(**changes: int) -> SGLangPlan:
    def edit(plan: dict[str, Any]) -> None:
        view = plan["tensors"][0]["views"][0]
        for field, value in changes.items():
            if field == "rows":
                view["shape"][0] += value
            else:
                view[field] += value

    return hand_plan(edit)


def test_a_row_in_the_next_block_is_caught() -> None:
    # K starts one token late: token 63 sits in page 1, a page of the right range but not its
    # own, and K's last token in V's first page. Both reads agree on the bytes; only the pages
    # say it is wrong. check_plan refuses it too.
    shifted = _k_buffer_edit(storage_offset=HEADS * 128)
    with pytest.raises(hp.PlanInvariantError):
        hp.check_plan(shifted)
    with pytest.raises(VerifyError, match=r"buffer inside pages.*row \[63, 0\].*its own page"
                       ) as caught:
        run(shifted, on=hand_plan())
    assert caught.value.byte_offset == PAGE * ROW_BYTES


def test_a_spare_row_in_the_pages_is_caught() -> None:
    # One K row more than the pages: it is V's first row, owned by V's pages.
    longer = _k_buffer_edit(rows=1)
    with pytest.raises(hp.PlanInvariantError, match="meet the page"):
        hp.check_plan(longer)
    with pytest.raises(VerifyError, match=rf"row \[{ROWS}, 0\].*meeting a page") as caught:
        run(longer, on=hand_plan())
    assert caught.value.byte_offset == ROWS * ROW_BYTES


def test_a_spare_row_past_every_page_verifies() -> None:
    # The allocation one row longer and V's extra row in it, past every page: what check_plan
    # proves, verify takes (it refused any row outside a page before).
    def longer_v(plan: dict[str, Any]) -> None:
        plan["pools"][0]["size"] += ROW_BYTES
        plan["tensors"][0]["size"] += ROW_BYTES
        plan["tensors"][0]["views"][1]["shape"][0] += 1

    sound = hand_plan(longer_v)
    hp.check_plan(sound)
    assert run(sound).layers == 2
