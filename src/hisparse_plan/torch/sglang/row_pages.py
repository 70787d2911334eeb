"""Where the rows of an SGLang view may lie, as check_plan proves it (checking/views.py), for
`verify` to hold every sampled row to: row j of layer l in that layer's page of block
j // per_page of the view's range, or, past the last block, a spare row in bytes no page of
the allocation owns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hisparse_plan.checking.views import rows_a_page
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, Pool
from hisparse_plan.torch.errors import VerifyError
from hisparse_plan.torch.sglang.binding import PageTrain, PlacedView


@dataclass(frozen=True, slots=True)
class RowPages:
    """Where a view's rows may lie, as check_plan proves it: row j of layer l in layer l's
    page of block j // per_page of the view's range (`owners`, one train a layer), or, past
    the last block, in bytes below `end` that no page of the allocation (`members`) owns: past
    every page (from `tail`) or between two. per_page 0: no row axis walks the pages, so a row
    may lie in any page of the range and none is spare."""

    owners: list[PageTrain]
    layered: bool
    per_page: int
    tail: int
    end: int
    members: list[PageTrain]

    @staticmethod
    def of(placed: PlacedView, owners: list[PageTrain], pool: Pool, bounds: tuple[int, int],
           members: list[PageTrain]) -> RowPages:
        view, layered = placed.view, pool.allocation == "whole"
        per_page = 0
        if owners and int(layered) < len(view.shape) - (view.strides[-1] == 1):
            step = view.strides[int(layered)] * BUFFER_DTYPE_SIZE[view.dtype]
            per_page = rows_a_page(step, owners[0].block_stride, pool.block_tokens or 1) or 0
        return RowPages(owners, layered, per_page, *bounds, members)

    def unowned(self, starts: torch.Tensor, run: int) -> torch.Tensor:
        """Whether each row [start, start + run) is inside the allocation and meets no page of
        it: of each train, only the first block whose page ends past the row's start can
        begin before the row's end."""
        free = starts + run <= self.end
        for train in self.members:
            stride = max(train.block_stride, 1)
            first = torch.clamp(torch.div(starts - train.start - train.size, stride,
                                          rounding_mode="floor") + 1, min=0)
            begin = train.start + first * train.block_stride
            free &= ~((first < train.num_blocks) & (begin < starts + run)
                      & (begin + train.size > starts))
        return free


def check_owned(
    where: str, placed: PlacedView, starts: torch.Tensor, run: int, pages: RowPages,
    index: list[torch.Tensor],
) -> None:
    """Every row [start, start + run) where `pages` says it may lie."""
    inside = torch.zeros_like(starts, dtype=torch.bool)
    if pages.per_page and pages.owners:  # a row past the last block: spare, on no page
        own = torch.div(index[int(pages.layered)], pages.per_page, rounding_mode="floor")
        inside |= (own >= pages.owners[0].num_blocks) & pages.unowned(starts, run)
    for number, train in enumerate(pages.owners):
        relative = starts - train.start
        stride = max(train.block_stride, 1)
        block = torch.div(relative, stride, rounding_mode="floor")
        within = (relative >= 0) & (block < train.num_blocks) & (
            relative - block * stride + run <= train.size)
        if pages.per_page:  # its own page: its layer's, its row's block
            own = torch.div(index[int(pages.layered)], pages.per_page, rounding_mode="floor")
            layer = index[0] == number if pages.layered else True
            within &= (own == block) & layer
        inside |= within
    if bool(inside.all()):
        return
    row = int(torch.nonzero(~inside)[0, 0])
    start = int(starts[row])
    position = tuple(int(axis[row]) for axis in index)
    raise VerifyError(
        f"verify failed (buffer inside pages): {where}: row {list(position)} is bytes "
        f"[{start}, {start + run}) of the allocation, outside its own page of "
        f"tensors[{placed.tensor}] (a row past the last block: meeting a page of the "
        f"allocation, whose pages end at byte {pages.tail}, or past its end); expected every "
        "row of SGLang's tensor inside its page, or a spare row in bytes no page owns",
        tensor=placed.tensor, layer=placed.allocation[1] or "", block=-1, byte_offset=start,
    )
