"""Where a vLLM DCP decode holds each token: vLLM 0.34's slot mapping written out as the
kernel does it (`_compute_slot_mappings_kernel`, `vllm/v1/worker/gpu/block_table.py`: a
virtual block of `block_size * dcp` tokens, the rank `offset // interleave % dcp`, its local
offset `offset // (interleave * dcp) * interleave + offset % interleave`), each byte read back
through the decode plan's own views (transfer_support.rank_cells). Its arithmetic is its own,
never the transfer's."""

from __future__ import annotations

import numpy as np

from hisparse_plan.exchange.transfer import Instance, TransferRequest
from support.transfer_support import Buffers, encode, layer_shapes, rank_cells


def slot_of(token: int, block: int, dcp: int, interleave: int, rank: int) -> int | None:
    """The kernel's local position of `token` on DCP rank `rank`, or None (not its token)."""
    virtual = block * dcp
    index, offset = divmod(token, virtual)
    if offset // interleave % dcp != rank:
        return None
    return index * block + offset // (interleave * dcp) * interleave + offset % interleave


def local_to_token(horizon: int, block: int, dcp: int, interleave: int, rank: int
                   ) -> dict[int, int]:
    """Every local position of the rank below `horizon` tokens -> its token."""
    found = {}
    for token in range(horizon):
        slot = slot_of(token, block, dcp, interleave, rank)
        if slot is not None:
            found[slot] = token
    return found


def expect(dst: Instance, blocks: dict[str, list[int]], out: Buffers, ids: dict[str, int],
           stop: dict[str, int], dcp: int, interleave: int) -> None:
    """Write what a DCP decode must hold: each rank's local positions, through its plan's
    views, with the bytes of the token (or page) the kernel puts there, for units < stop."""
    for index, plan in enumerate(dst.plans):
        rank = index % dcp
        for name, cells_of in rank_cells(plan, index, dst.ranks, dst.total_kv_heads):
            probe = cells_of(0)[0]
            table = blocks[probe.table]
            tokens_per_block = probe.units * probe.tokens
            lookup = local_to_token(len(table) * tokens_per_block * dcp, tokens_per_block, dcp,
                                    interleave, rank)
            for position, block in enumerate(table):
                for cells in cells_of(block):
                    local = position * cells.units + cells.unit
                    first_token = local * cells.tokens  # a page: its first token
                    token = np.array([lookup.get(int(t), -1) for t in first_token.ravel()],
                                     dtype=np.int64)
                    unit = np.where(token < 0, -1, token // cells.tokens)
                    keep = (unit >= 0) & (unit < stop[name])
                    value = encode(ids[name], unit, cells.head, cells.byte)
                    out[(index, cells.region)][cells.addresses[keep]] = value[keep]




def expected_after(src: Instance, dst: Instance, request: TransferRequest, start: Buffers,
                   dcp: int, interleave: int) -> tuple[Buffers, Buffers]:
    """(what a DCP decode that starts as `start` must hold after `request` moved, what it
    may hold): each layer's cells in the request's blocks, the source's bytes written by
    transfer_support.write (layer ids by sorted name), every other byte as it started."""
    theirs, ours = layer_shapes(dst), layer_shapes(src)
    ids = {name: number for number, name in enumerate(sorted(theirs))}
    need, may = {}, {}
    for name, cells in theirs.items():
        tokens = max(cells.tokens, 1)
        need[name] = -(-request.num_tokens // tokens)
        held_src = len(request.source_blocks[ours[name].table]) * ours[name].units
        held_dst = len(request.destination_blocks[cells.table]) * cells.units * dcp
        may[name] = need[name] if cells.kind == "pages" else min(held_src, held_dst)
    expected = {key: value.copy() for key, value in start.items()}
    expect(dst, dict(request.destination_blocks), expected, ids, need, dcp, interleave)
    allowed = {key: value.copy() for key, value in expected.items()}
    expect(dst, dict(request.destination_blocks), allowed, ids, may, dcp, interleave)
    return expected, allowed
