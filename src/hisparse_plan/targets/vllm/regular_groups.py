"""Grouping layers that share no host pool: the strategies of SPEC 7.3, first that applies wins.

Used for a regular request's layers and for the other (non-MLA) layers of a HiSparse one (5.2).
"""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.models import KVCacheLayout
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import (
    Layer,
    PlannedGroup,
    first_of_each_spec,
    single_spec_group,
    uniform_group,
)
from hisparse_plan.targets.vllm.packed import packed_groups
from hisparse_plan.targets.vllm.rules.families import one_family
from hisparse_plan.targets.vllm.rules.pages import check_pages
from hisparse_plan.targets.vllm.rules.uniform_spec import merged_spec
from hisparse_plan.targets.vllm.rules.window_merges import refuse_uniform_merge
from hisparse_plan.targets.vllm.unified import unified_groups


def regular_groups(
    layers: Sequence[Layer], layout: KVCacheLayout, trace: Trace
) -> list[PlannedGroup]:
    """The groups of SPEC 7.3 over `layers` (request order); none for no layers."""
    if not layers:
        return []
    first_layers = first_of_each_spec(layers)
    check_pages(first_layers)
    refuse_uniform_merge(first_layers)
    distinct = [spec for _, spec in first_layers]
    merged = merged_spec(distinct)
    if merged is not None:
        trace.add("group", "7.3 rule 1", "strategy", "uniform spec",
                  lambda: f"all {len(layers)} layers are one {merged.kind} spec")
        return [single_spec_group(merged, [name for name, _ in layers])]
    if one_family(distinct):
        trace.add("group", "7.3 rule 2", "strategy", "uniform type",
                  lambda: f"{len(layers)} layers of {len(distinct)} specs are one family "
                  f"led by {distinct[0].kind}")
        return [uniform_group(layers)]
    pages = {spec.page_size_bytes for spec in distinct}
    if layout.block_outermost and len(pages) > 1:
        trace.add("group", "7.3.1", "strategy", "packed",
                  lambda: f"{len(pages)} distinct pages in block-outermost {layout.value}")
        return packed_groups(layers, trace)
    trace.add("group", "7.3.2", "strategy", "unified pages",
              lambda: f"{len(distinct)} specs, {len(pages)} distinct page(s), {layout.value}")
    return unified_groups(layers, trace)
