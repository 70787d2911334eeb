"""Layer views: where each layer's pages sit in its pool, derived from a finished plan.

The plan gives each tensor's offset, layer stride and block stride; the layout gives the strides
inside a page. A `LayerView` joins them into the shape and byte strides of one layer, which is
what a backend needs to take a strided view, and what the checker needs to prove pages disjoint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import (
    AttentionLayerSpec,
    DType,
    GroupSpec,
    KVCachePlan,
    KVCacheTensor,
    MambaSpec,
    UniformTypeSpec,
    dtype_size,
)
from hisparse_plan.models.any_plan import expect_plan
from hisparse_plan.rules.strides import axis_strides, page_extents


@dataclass(frozen=True, slots=True)
class Train:
    """One contiguous run of a layer's page, repeated once per block, `period` bytes apart:
    `count` runs in all, the first at byte `start` of the pool."""

    start: int
    run: int
    period: int
    count: int
    tensor: int
    layer: str
    group: int


@dataclass(frozen=True, slots=True)
class LayerView:
    """One layer of one tensor: block `b`'s page holds the elements of `shape[1:]` at byte
    `offset + b * strides[0] + sum(i * s for i, s in zip(index, strides[1:]))` of its pool."""

    name: str
    tensor: int
    """Index into `plan.tensors`."""
    group: int
    """Index into `plan.groups`."""
    host_resident: bool
    stage: int
    """Index into `plan.device_pools` (0 for the host pool)."""
    dtype: DType
    shape: tuple[int, ...]
    """(num_blocks, heads, tokens, elements) for attention layers; (num_blocks, page bytes)
    for resident and hot layers, which are byte buffers."""
    strides: tuple[int, ...]
    """Byte strides, one per axis of `shape`."""
    offset: int
    """Byte offset of block 0 in the pool."""
    page_size_bytes: int

    @property
    def pool(self) -> tuple[bool, int]:
        """Which pool the view lies in: (host_resident, stage)."""
        return self.host_resident, self.stage

    @property
    def num_blocks(self) -> int:
        return self.shape[0]

    @property
    def block_stride(self) -> int:
        return self.strides[0]

    @property
    def itemsize(self) -> int:
        return dtype_size(self.dtype)

    def runs(self) -> tuple[int, list[int]]:
        """The page as contiguous runs: (run bytes, byte start of each run within block 0's page).

        Inner axes whose stride equals the bytes already covered merge into one run; any other
        axis repeats the run (the heads axis of BHLNC or LHBNC, whose strides skip over other
        layers or blocks).
        """
        axes = sorted(
            (stride, extent)
            for stride, extent in zip(self.strides[1:], self.shape[1:], strict=True)
            if extent > 1
        )
        run = self.itemsize
        starts = [0]
        for stride, extent in axes:
            if stride == run and starts == [0]:
                run *= extent
            else:
                starts = [start + i * stride for i in range(extent) for start in starts]
        return run, sorted(starts)

    def misaligned(self) -> tuple[str, int] | None:
        """The first of offset and strides that is not whole elements of the dtype, as
        (what, bytes); None when the layer can be viewed in its dtype."""
        names = ("offset", "block stride", "head stride", "token stride")
        for what, value in zip(names, (self.offset, *self.strides), strict=False):
            if value % self.itemsize:
                return what, value
        return None

    def trains(self) -> list[Train]:
        """The layer's pages as trains: one per run of a page (one per head where heads are
        apart), each repeated for every block."""
        run, starts = self.runs()
        return [
            Train(self.offset + start, run, self.block_stride, self.num_blocks, self.tensor,
                  self.name, self.group)
            for start in starts
        ]


def spec_of(plan: KVCachePlan) -> dict[str, tuple[int, GroupSpec]]:
    """Every group layer's (group index, own spec): a uniform_type member's own spec."""
    specs: dict[str, tuple[int, GroupSpec]] = {}
    for index, group in enumerate(plan.groups):
        if isinstance(group.spec, UniformTypeSpec):
            for name in group.layer_names:
                member = group.spec.specs.get(name)
                specs[name] = (index, member if member is not None else group.spec)
        else:
            for name in group.layer_names:
                specs[name] = (index, group.spec)
    return specs


def pool_name(plan: KVCachePlan, stage: int, host_resident: bool = False) -> str:
    """"host", "device", or "stage k device" when pipeline stages have pools of their own."""
    if host_resident:
        return "host"
    return "device" if len(plan.device_pools) == 1 else f"stage {stage} device"


def stage_of(plan: KVCachePlan) -> dict[str, int]:
    """Each device layer's pipeline stage; empty when one stage holds every layer."""
    return {
        name: stage
        for stage, pool in enumerate(plan.device_pools)
        if pool.layers is not None
        for name in pool.layers
    }


def tensor_stage(plan: KVCachePlan, index: int, stages: dict[str, int] | None = None) -> int:
    """The stage whose pool holds `plan.tensors[index]` (0 for host tensors)."""
    tensor = plan.tensors[index]
    if tensor.host_resident or len(plan.device_pools) == 1:
        return 0
    stages = stage_of(plan) if stages is None else stages
    stage = stages.get(tensor.layers[0])
    if stage is None:
        raise PlanInvariantError(
            f"tensors[{index}] places {tensor.layers[0]!r}, which no pipeline stage lists",
            tensor=index, layer=tensor.layers[0],
        )
    return stage


def tensor_views(
    plan: KVCachePlan,
    index: int,
    specs: dict[str, tuple[int, GroupSpec]] | None = None,
    stages: dict[str, int] | None = None,
) -> list[LayerView]:
    """The views of every layer of `plan.tensors[index]`, in the tensor's layer order."""
    plan = expect_plan(KVCachePlan, plan, "tensor_views")
    tensor = plan.tensors[index]
    specs = spec_of(plan) if specs is None else specs
    stage = tensor_stage(plan, index, stages)
    return [
        _layer_view(plan, index, tensor, position, name, specs, stage)
        for position, name in enumerate(tensor.layers)
    ]


def plan_views(
    plan: KVCachePlan, specs: dict[str, tuple[int, GroupSpec]] | None = None
) -> dict[str, LayerView]:
    """Every placed layer's view, by layer name (`specs` is `spec_of(plan)` when known). An
    SGLang plan's views are its own (`BufferView`s on its tensors): it is refused here."""
    plan = expect_plan(KVCachePlan, plan, "plan_views")
    specs = spec_of(plan) if specs is None else specs
    stages = stage_of(plan)
    return {
        view.name: view
        for index in range(len(plan.tensors))
        for view in tensor_views(plan, index, specs, stages)
    }


def shared_views(plan: KVCachePlan, views: dict[str, LayerView]) -> dict[str, LayerView]:
    """Each sharing layer's view (`plan.kv_sharing`): its target's view under its own name, the
    very pages the target's view reaches and no others (`views` is `plan_views(plan)`)."""
    shared = {}
    for name, target in plan.kv_sharing.items():
        view = views.get(target)
        if view is None:
            raise PlanInvariantError(
                f"kv_sharing[{name!r}] names {target!r}, which no tensor places; expected a "
                "placed layer whose pages it reads",
                layer=name,
            )
        shared[name] = replace(view, name=name)
    return shared


def _layer_view(
    plan: KVCachePlan,
    index: int,
    tensor: KVCacheTensor,
    position: int,
    name: str,
    specs: dict[str, tuple[int, GroupSpec]],
    stage: int,
) -> LayerView:
    found = specs.get(name)
    if found is None:
        raise PlanInvariantError(
            f"tensors[{index}] places layer {name!r}, which no group lists; expected every "
            "placed layer to belong to a group",
            tensor=index,
            layer=name,
        )
    group, spec = found
    if tensor.host_resident:
        if plan.host_pool is None:
            raise PlanInvariantError(
                f"tensors[{index}] is host-resident but the plan has no host pool",
                tensor=index,
                layer=name,
            )
        num_blocks, layout = plan.host_pool.num_blocks, plan.host_pool.layout
    else:
        num_blocks, layout = plan.num_blocks, plan.device_pools[stage].layout
    offset = tensor.offset + position * tensor.layer_stride
    if not isinstance(spec, AttentionLayerSpec):
        # Resident/hot rows and Mamba states are byte buffers: a page's used bytes in a row.
        used = spec.content_bytes if isinstance(spec, MambaSpec) else spec.page_size_bytes
        return LayerView(
            name, index, group, tensor.host_resident, stage, "uint8",
            (num_blocks, used), (tensor.block_stride, 1), offset, spec.page_size_bytes,
        )
    extents = page_extents(spec, len(tensor.layers), num_blocks)
    strides = axis_strides(layout, extents, {"L": tensor.layer_stride, "B": tensor.block_stride})
    itemsize = spec.dtype_size
    return LayerView(
        name, index, group, tensor.host_resident, stage, spec.dtype,
        (num_blocks, extents["H"], extents["N"], extents["C"] // itemsize),
        (tensor.block_stride, strides["H"], strides["N"], itemsize),
        offset, spec.page_size_bytes,
    )
