"""Layer views (views.py) of real plans, judged by arithmetic written out here from the plan's
JSON: a layer's block 0 sits at its tensor's offset plus its place in the tensor times the layer
stride, block b at that plus b block strides, and inside a page the head and token strides follow
the layout (BLNHC: tokens outside heads; LBHNC: heads outside tokens)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.views import plan_views
from support import paths

GOLDEN = paths.TESTS / "golden" / "regular_llama3_8b_bf16"


def _request(layout: str) -> hp.PlanRequest:
    data: dict[str, Any] = json.loads(GOLDEN.with_suffix(".request.json").read_text())
    data["device"]["kv_cache_layout"] = layout
    return hp.PlanRequest.model_validate(data)


# Llama-3-8B: 8 KV heads of 128 elements, K and V, bf16, 16 tokens a block.
HEADS, ELEMENTS, TOKENS, ITEM = 8, 2 * 128, 16, 2


@pytest.mark.parametrize(("layout", "head_stride", "token_stride"), [
    ("BLNHC", ELEMENTS * ITEM, HEADS * ELEMENTS * ITEM),
    ("LBNHC", ELEMENTS * ITEM, HEADS * ELEMENTS * ITEM),
    ("LBHNC", TOKENS * ELEMENTS * ITEM, ELEMENTS * ITEM),
    ("BLHNC", TOKENS * ELEMENTS * ITEM, ELEMENTS * ITEM),
])
def test_every_layer_view_is_where_its_tensor_puts_it(layout: str, head_stride: int,
                                                      token_stride: int) -> None:
    plan = hp.plan(_request(layout))
    data = json.loads(plan.model_dump_json())
    views = plan_views(plan)
    seen = 0
    for index, tensor in enumerate(data["tensors"]):
        for place, name in enumerate(tensor["layers"]):
            view = views[name]
            assert view.tensor == index
            assert view.offset == tensor["offset"] + place * tensor["layer_stride"]
            assert view.shape == (data["num_blocks"], HEADS, TOKENS, ELEMENTS)
            assert view.strides == (tensor["block_stride"], head_stride, token_stride, ITEM)
            seen += 1
    assert seen == 32 == len(views)


def test_a_block_outermost_block_holds_every_layer_once() -> None:
    plan = hp.plan(_request("BLNHC"))
    page = HEADS * TOKENS * ELEMENTS * ITEM
    views = plan_views(plan)
    assert {view.block_stride for view in views.values()} == {32 * page}
    assert sorted(view.offset for view in views.values()) == [i * page for i in range(32)]
