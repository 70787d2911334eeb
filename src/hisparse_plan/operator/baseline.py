"""The all-GPU baseline: the same model on the same GPU memory without HiSparse.

Without HiSparse every MLA layer, source and indexer, keeps its pages on the GPU in one block
table, so a block costs source_page + indexer_page (plus the pages of any regular layers, which
sit on the GPU either way) and a max_model_len request takes ceil(max_model_len / block_size)
blocks:

    concurrency = (available_bytes // bytes_per_block) / ceil(max_model_len / block_size)
"""

from __future__ import annotations

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.base import ByteCount, Model, PositiveInt
from hisparse_plan.models.plan import Concurrency
from hisparse_plan.rules.required import required_blocks

DERIVED_KINDS = ("hisparse_resident", "hisparse_hot")
"""HiSparse's own GPU groups, which the baseline does not have."""


class BaselineCapacity(Model):
    """How many max_model_len requests fit when the whole cache is on the GPU."""

    max_concurrency: Concurrency
    bytes_per_block: PositiveInt
    """source_page + indexer_page (+ regular layers' pages)."""
    num_blocks: ByteCount
    """available_bytes // bytes_per_block."""
    blocks_per_request: PositiveInt
    """ceil(max_model_len / block_size)."""


def baseline_capacity(plan: KVCachePlan) -> BaselineCapacity:
    """The baseline on the plan's device memory (`device.available_bytes`, never an override)."""
    source = next(group for group in plan.groups if group.role == "hisparse_source")
    block_size = source.spec.block_size
    pages = []
    for group in plan.groups:
        if group.spec.kind not in DERIVED_KINDS:
            if group.spec.block_size != block_size:
                raise UnsupportedRequestError(
                    f"the all-GPU baseline puts every layer in one block table, so it needs one "
                    f"block size; the MLA layers have {block_size}, layers like "
                    f"{group.layer_names[0]!r} have {group.spec.block_size}",
                    field="layers",
                )
            pages.append(group.spec.page_size_bytes)
    per_block = sum(pages)
    num_blocks = plan.device_pool.available_bytes // per_block
    per_request = required_blocks(source.spec, plan.max_model_len, plan.workload)
    return BaselineCapacity(
        max_concurrency=num_blocks / per_request,
        bytes_per_block=per_block,
        num_blocks=num_blocks,
        blocks_per_request=per_request,
    )
