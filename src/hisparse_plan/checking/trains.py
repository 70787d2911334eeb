"""A pool's pages as trains whose number grows with tensors and layers, never with heads.

A page whose heads lie apart (LHBNC, BHLNC) is one run per head. Listing those runs would make
the proof cost grow with num_kv_heads, so the two shapes a layout can give are summed up by
arithmetic instead:

* Heads exactly one block train apart (LHBNC: the head stride is num_blocks block strides):
  head h's block b is run `h * num_blocks + b` of one train of `heads * num_blocks` runs, all
  one block stride apart. Run k then holds block `k % num_blocks`, which the proof reads.
* A tensor whose layers interleave head by head (BHLNC: the layer stride is one head's run and
  the head stride is all the layers' runs): its layers' heads tile one contiguous run of each
  block, so the tensor is one train. Its layers share a group (checked before), so the proof
  needs no finer owner than the tensor; a clash is reported at the layer holding the byte.

Any other spacing is listed run by run while that stays under `MAX_LISTED_RUNS` per page, and
refused beyond it: such a page can only come from an edited plan, and its runs cannot be
summed up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import prod

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.views import LayerView, Train

MAX_LISTED_RUNS = 64
"""Runs per page listed one by one when no arithmetic shape sums them up."""


@dataclass(frozen=True, slots=True)
class InterleavedTrain(Train):
    """A tensor's interleaved layers as one train: byte `i` of a run is layer
    `(i // layer_run) % len(layers)`'s."""

    layers: tuple[str, ...] = ()
    layer_run: int = 0

    def layer_at(self, byte: int) -> str:
        """The layer whose page holds `byte` of the pool (the first layer off the train)."""
        if self.period <= 0 or self.layer_run <= 0 or not self.layers:
            return self.layer
        within = (byte - self.start) % self.period
        if not 0 <= within < self.run:
            return self.layer
        return self.layers[(within // self.layer_run) % len(self.layers)]


def layer_at(train: Train, byte: int) -> str:
    """The layer holding `byte`, for a train that may stand for several interleaved layers."""
    return train.layer_at(byte) if isinstance(train, InterleavedTrain) else train.layer


@dataclass(frozen=True, slots=True)
class PageRuns:
    """A page as `run` contiguous bytes, repeated along the axes the run cannot absorb."""

    run: int
    apart: tuple[tuple[int, int], ...]
    """(byte stride, extent) of every axis whose stride skips bytes, innermost first."""

    @property
    def count(self) -> int:
        return prod(extent for _, extent in self.apart)


def page_runs(view: LayerView) -> PageRuns:
    """Merge inner axes whose stride equals the bytes already covered into one run (as
    `LayerView.runs`, without listing the starts)."""
    axes = sorted(
        (stride, extent)
        for stride, extent in zip(view.strides[1:], view.shape[1:], strict=True)
        if extent > 1
    )
    run = view.itemsize
    apart: list[tuple[int, int]] = []
    for stride, extent in axes:
        if stride == run and not apart:
            run *= extent
        else:
            apart.append((stride, extent))
    return PageRuns(run, tuple(apart))


def tensor_trains(views: list[LayerView]) -> list[Train]:
    """The trains of one tensor's layers (`views` in the tensor's layer order)."""
    views = [view for view in views if 0 not in view.shape]  # a page of no element: no byte
    if not views:
        return []
    pages = [page_runs(view) for view in views]
    merged = _interleaved_tensor(views, pages)
    if merged is not None:
        return [merged]
    trains: list[Train] = []
    for view, page in zip(views, pages, strict=True):
        trains.extend(_layer_trains(view, page))
    return trains


def pool_trains(views: Iterable[LayerView]) -> list[Train]:
    """The trains of every view, taken tensor by tensor."""
    by_tensor: dict[int, list[LayerView]] = {}
    for view in views:
        by_tensor.setdefault(view.tensor, []).append(view)
    trains: list[Train] = []
    for members in by_tensor.values():
        trains.extend(tensor_trains(members))
    return trains


def _train(view: LayerView, start: int, run: int, count: int) -> Train:
    return Train(start, run, view.block_stride, count, view.tensor, view.name, view.group)


def _layer_trains(view: LayerView, page: PageRuns) -> list[Train]:
    if not page.apart:
        return [_train(view, view.offset, page.run, view.num_blocks)]
    if len(page.apart) == 1:
        stride, heads = page.apart[0]
        if stride == view.num_blocks * view.block_stride:
            return [_train(view, view.offset, page.run, heads * view.num_blocks)]
    if page.count <= MAX_LISTED_RUNS:
        starts = [0]
        for stride, extent in page.apart:
            starts = [start + i * stride for i in range(extent) for start in starts]
        return [_train(view, view.offset + start, page.run, view.num_blocks)
                for start in sorted(starts)]
    spacing = ", ".join(f"{extent} x {stride} bytes" for stride, extent in page.apart)
    raise PlanInvariantError(
        f"tensors[{view.tensor}] layer {view.name!r}: its page is {page.count} runs of "
        f"{page.run} bytes ({spacing} apart), which neither lie one block train apart nor "
        "interleave with the tensor's other layers head by head, so it cannot be proved "
        "disjoint without listing every run; expected the strides the layout gives (for "
        "BHLNC, a layer stride of one head's bytes)",
        tensor=view.tensor, layer=view.name,
    )


def _interleaved_tensor(views: list[LayerView], pages: list[PageRuns]) -> Train | None:
    """The tensor as one train when its layers' runs tile one span of each block: every layer
    one run of `run` bytes per head, layer l at `l * run`, head h at `h * layers * run`."""
    first, page = views[0], pages[0]
    if len(page.apart) != 1 or any(other != page for other in pages):
        return None
    stride, heads = page.apart[0]
    layers = len(views)
    if stride != layers * page.run:
        return None
    for position, view in enumerate(views):
        if view.offset != first.offset + position * page.run or (
                view.block_stride, view.num_blocks, view.group) != (
                first.block_stride, first.num_blocks, first.group):
            return None
    return InterleavedTrain(
        first.offset, heads * layers * page.run, first.block_stride, first.num_blocks,
        first.tensor, first.name, first.group,
        layers=tuple(view.name for view in views), layer_run=page.run,
    )
