"""A hand-written SGLang plan of one MHA pool, and its figures (rows, heads, page, bytes)."""

from __future__ import annotations

import copy
from typing import Any

ROWS, HEADS, DIM, PAGE = 1088, 8, 128, 64


ROW_BYTES = HEADS * DIM * 2


HALF = ROWS * ROW_BYTES


def mha_plan() -> dict[str, Any]:
    """Two layers in SGLang's per-layer buffers: K rows then V rows, 64-token pages."""
    page_bytes = PAGE * ROW_BYTES
    view = {"dtype": "bfloat16", "shape": [ROWS, HEADS, DIM], "strides": [HEADS * DIM, DIM, 1]}
    return {
        "schema_version": 2, "engine": "sglang", "page_size": PAGE,
        "pools": [{"name": "kv", "location": "device", "allocation": "per_layer",
                   "size": 2 * HALF, "num_blocks": ROWS // PAGE, "block_tokens": PAGE,
                   "padding_blocks": 1}],
        "tensors": [{
            "size": 2 * HALF, "layers": ["l0", "l1"], "layer_stride": 0,
            "block_stride": page_bytes, "offset": 0, "host_resident": False, "pool": "kv",
            "ranges": [{"offset": 0, "size": page_bytes}, {"offset": HALF, "size": page_bytes}],
            # Each view its own lists, so that editing one view's shape leaves the other's.
            "views": [copy.deepcopy(dict(view, name=name, storage_offset=offset))
                      for name, offset in (("k_buffer", 0), ("v_buffer", ROWS * HEADS * DIM))],
        }],
        "max_total_num_tokens": ROWS - PAGE, "max_running_requests": 8,
        "req_to_token": {"name": "req_to_token", "dtype": "int32", "shape": [9, 4100],
                         "strides": [4100, 1], "storage_offset": 0},
        "budget": {"available_bytes": 10**9, "cell_size_bytes": 2 * 2 * ROW_BYTES,
                   "mem_fraction_static": None},
        "capacity": {"max_concurrency": 0.25, "steady_state_concurrency": None},
    }
