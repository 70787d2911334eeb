"""The golden request/plan pairs and the projection they are compared on."""

from __future__ import annotations

import json
from typing import Any

from support import paths

REPO = paths.REPO
VENDORED = REPO / "tests" / "golden"
SHARED = REPO.parent / "shared" / "golden"
GOLDEN = SHARED if SHARED.is_dir() else VENDORED
"""The shared golden cases when this checkout sits beside them, else the vendored copy."""

CASES = sorted(path.name.removesuffix(".request.json") for path in GOLDEN.glob("*.request.json"))
SPEC_FIELDS = ("kind", "block_size", "page_size_bytes", "blocks_per_request")
TENSOR_FIELDS = ("size", "layers", "layer_stride", "block_stride", "offset", "host_resident")


def load(case: str) -> tuple[dict[str, Any], dict[str, Any]]:
    request = json.loads((GOLDEN / f"{case}.request.json").read_text())
    expected = json.loads((GOLDEN / f"{case}.expected.json").read_text())
    return request, expected


def project(plan: dict[str, Any]) -> dict[str, Any]:
    """The fields the golden README lists, with capacity rounded to 6 decimals; a plan without a
    host pool lists its fields as null, and fitted_max_model_len only when it is set."""
    host = plan["host_pool"]
    projected: dict[str, Any] = {
        "num_blocks": plan["num_blocks"],
        "groups": [
            {
                "layer_names": group["layer_names"],
                "spec": {field: group["spec"].get(field) for field in SPEC_FIELDS},
                "role": group["role"],
                "host_resident": group["host_resident"],
                "enable_kv_transfer": group["enable_kv_transfer"],
            }
            for group in plan["groups"]
        ],
        "tensors": [
            {field: tensor[field] for field in TENSOR_FIELDS} for tensor in plan["tensors"]
        ],
        "host_pool": {
            field: None if host is None else host[field]
            for field in ("num_blocks", "block_stride", "shared")
        },
        "capacity": {
            name: None if value is None else round(value, 6)
            for name, value in plan["capacity"].items()
        },
    }
    if plan.get("fitted_max_model_len") is not None:
        projected["fitted_max_model_len"] = plan["fitted_max_model_len"]
    return projected
