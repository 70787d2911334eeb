"""The host pool's placement, re-derived by arithmetic of its own (SPEC 5.9, and the
block_outermost option of docs/transfer.md#placement-that-transfers-well).

The host pool holds the source group only, so its geometry is fixed by the group's pages and the
pool's layout, without the planner's stride walk:

* LBNHC (vLLM's runtime): held to what every placement is held to (aligned views, no byte
  shared, every page inside the pool; `checking/geometry.py`), like the device pools.
* BLNHC (the block_outermost option): the option promises a geometry, not only a sound one:
  each block is one slab of `bytes_per_block` bytes holding every source layer's page back to
  back, in the tensors' order, filled exactly, so a run of consecutive blocks is one contiguous
  range of the pool (what a block-outermost prefill's latent pages line up with). This check
  pins that one placement, so a plan edited to another sound one (a shifted offset, a stride
  that leaves gaps or interleaves blocks) is refused naming the tensor and the field.
"""

from __future__ import annotations

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import KVCacheLayout, KVCachePlan
from hisparse_plan.targets.vllm.rules.buckets import spec_buckets
from hisparse_plan.views import spec_of

HOST_LAYOUTS = (KVCacheLayout.LBNHC, KVCacheLayout.BLNHC)
"""The host layouts a plan may name: vLLM's, and the block_outermost option's."""


def check_host_placement(plan: KVCachePlan) -> None:
    host = plan.host_pool
    if host is None:
        return
    if host.layout not in HOST_LAYOUTS:
        raise PlanInvariantError(
            f"host_pool.layout is {host.layout.value}; expected LBNHC (vLLM's host pool) or "
            "BLNHC (hisparse.host_pool_layout 'block_outermost')"
        )
    if not host.layout.block_outermost:
        return
    specs = spec_of(plan)
    at = 0  # the next tensor's first byte
    for index, tensor in enumerate(plan.tensors):
        if not tensor.host_resident:
            continue
        page = specs[tensor.layers[0]][1].page_size_bytes
        for name in tensor.layers[1:]:
            other = specs[name][1].page_size_bytes
            if other != page:
                raise PlanInvariantError(
                    f"tensors[{index}] places {name!r} ({other}-byte pages) beside "
                    f"{tensor.layers[0]!r} ({page}-byte pages); expected one page size a tensor",
                    tensor=index, layer=name,
                )
        want = (page, host.bytes_per_block, at)
        at += len(tensor.layers) * page
        got = (tensor.layer_stride, tensor.block_stride, tensor.offset)
        for field, value, expected in zip(("layer_stride", "block_stride", "offset"), got, want,
                                          strict=True):
            if value != expected:
                raise PlanInvariantError(
                    f"tensors[{index}].{field} is {value}; expected {expected} in the BLNHC "
                    "host pool (a block's source pages back to back: layer stride the page, "
                    "block stride bytes_per_block, each tensor after the pages before it)",
                    tensor=index, layer=tensor.layers[0],
                )
    _check_order(plan)
    if at != host.bytes_per_block:
        raise PlanInvariantError(
            f"the host tensors fill {at} bytes of a BLNHC host block; expected bytes_per_block "
            f"{host.bytes_per_block} (the source pages back to back fill it exactly)"
        )



def _check_order(plan: KVCachePlan) -> None:
    """The block's pages in the order vLLM places a group's layers (by spec in order of first
    appearance, then the group's order: `spec_buckets`), the order a block-outermost prefill's
    latent pages take, so a block lines up page for page."""
    placed = [name for tensor in plan.tensors if tensor.host_resident for name in tensor.layers]
    group = next(group for group in plan.groups if group.host_resident)
    source = [name for bucket in spec_buckets(group.spec, group.layer_names)
              for name in bucket.names]
    for position, (got, want) in enumerate(zip(placed, source, strict=False)):
        if got != want:
            raise PlanInvariantError(
                f"the BLNHC host block's page {position} is layer {got!r}; expected {want!r}, "
                "the source group's layers in vLLM's placement order (by spec, then the "
                "group's order)",
                layer=got,
            )
