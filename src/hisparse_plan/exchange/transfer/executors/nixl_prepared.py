"""Posting a proved pattern with NIXL the way engines' connectors post (see
docs/transfer.md#how-a-connector-uses-it): each region registered once (nixl_direct's
endpoint), one prepared list per side at handshake, per request `make_prepped_xfer` with
index arrays computed in numpy.

A prepared list holds, for each link (a pair of tables) and each block id of that side's
table, the copies of each pattern row of the link: one Nx5 strided entry (address, length,
device, stride, count) per row and block (the default), or without `strided` its `count`
contiguous copies as Nx3 entries. Either way a request's indices name copies (NIXL indexes a
strided entry's copies one by one): the copy `i` of row `t` at block `b` is `start[link] +
b * per_block[link] + first[t] + i`. nixl-cu12 1.5.1 posts from both at the same cost per
copy (measured interleaved, 158,720 copies: 12.3 and 11.9 ms of CPU); the strided list is
the compact one. NIXL is imported with nixl_direct, never by the package.

Either side may initiate: the source WRITEs into the destination (push), or the destination
READs from the source (pull, vLLM's default) and NIXL's notification tells the source. Each
list holds one memory type (NIXL's lists do): a pattern whose regions mix DRAM and VRAM (a
HiSparse decode's host pool and device index keys) is posted as one sub-pattern per pair of
memory types, each with its own lists (`hisparse_plan.connectors.peering` cuts them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.executors.nixl_direct import Addresses, Endpoint, run_to_done
from hisparse_plan.exchange.transfer.pattern.instance import Instantiated
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern

Ints = NDArray[np.int64]
INDEX_LIMIT = 2**31 - 1
"""make_prepped_xfer takes int32 indices."""


@dataclass(frozen=True)
class Layout:
    """Where each row's copies sit in one side's prepared list."""

    start: Ints
    """Per link: its first index."""
    per_block: Ints
    """Per link: copies per block (the link's rows' counts, summed)."""
    first: Ints
    """Per row: its first copy within one block's entries."""
    count: Ints
    """Per row: its copies."""
    link: Ints
    """Per row: its link."""


def layout(pattern: TransferPattern, side: str) -> tuple[Layout, int]:
    """The list's layout for one side, and its length in copies."""
    tables = {t.name: t.num_blocks for t in (pattern.source_tables if side == "source"
                                             else pattern.destination_tables)}
    count = np.array([row.count for row in pattern.rows], dtype=np.int64)
    link = np.array([row.link for row in pattern.rows], dtype=np.int64)
    first = np.zeros(len(pattern.rows), dtype=np.int64)
    per_block = np.zeros(len(pattern.links), dtype=np.int64)
    start = np.zeros(len(pattern.links), dtype=np.int64)
    at = 0
    for index, spec in enumerate(pattern.links):
        rows = np.flatnonzero(link == index)
        first[rows] = np.cumsum(count[rows]) - count[rows]
        per_block[index] = int(count[rows].sum())
        start[index] = at
        table = spec.source_table if side == "source" else spec.destination_table
        at += int(per_block[index]) * tables[table]
    if at > INDEX_LIMIT:
        raise TransferCheckError(f"the {side}'s prepared list would hold {at:,} copies; NIXL "
                                 f"indexes at most {INDEX_LIMIT:,}")
    return Layout(start, per_block, first, count, link), at


def entries(pattern: TransferPattern, side: str, addresses: Addresses, device: int = 0
            ) -> NDArray[np.uint64]:
    """The side's prepared list as an Nx5 strided array, every entry checked to lie inside
    its region for every block id of its table."""
    tables = {t.name: t.num_blocks for t in (pattern.source_tables if side == "source"
                                             else pattern.destination_tables)}
    source = side == "source"
    parts = []
    for index, spec in enumerate(pattern.links):
        rows = [row for row in pattern.rows if row.link == index]
        blocks = np.arange(tables[spec.source_table if source else spec.destination_table],
                           dtype=np.int64)[:, None]
        columns = np.array([[
            *addresses[(row.src_rank, row.src_region) if source
                       else (row.dst_rank, row.dst_region)],
            row.src_offset if source else row.dst_offset,
            row.src_block_stride if source else row.dst_block_stride,
            row.length, row.count,
            (row.src_stride if source else row.dst_stride) if row.count > 1 else row.length,
        ] for row in rows], dtype=np.int64).reshape(-1, 7)
        base, size, offset, block_stride, length, count, stride = columns.T
        at = offset[None, :] + blocks * block_stride[None, :]
        end = at + (count - 1)[None, :] * stride[None, :] + length[None, :]
        if (end > size[None, :]).any():
            raise TransferCheckError(f"link {index}: a row at some block of its {side} table "
                                     "leaves its region")
        shape = at.shape
        parts.append(np.stack([
            (base[None, :] + at).ravel(), np.broadcast_to(length, shape).ravel(),
            np.full(at.size, device), np.broadcast_to(stride, shape).ravel(),
            np.broadcast_to(count, shape).ravel()], axis=1))
    if not parts:
        return np.zeros((0, 5), dtype=np.uint64)
    return np.concatenate(parts).astype(np.uint64)


def dense(strided: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """Nx5 strided entries as their contiguous copies, Nx3 (address, length, device), in
    order."""
    count = strided[:, 4].astype(np.int64)
    entry = np.repeat(np.arange(len(strided)), count)
    chunk = (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
             ).astype(np.uint64)
    return np.stack([strided[entry, 0] + chunk * strided[entry, 3], strided[entry, 1],
                     strided[entry, 2]], axis=1)


@dataclass
class Prepared:
    """Both sides' prepared lists, made once per pair of instances (at handshake), on the
    initiator's agent: `local` is the initiator's list, `remote` the peer's."""

    pattern: TransferPattern
    local: Any
    remote: Any
    peer: str
    layouts: tuple[Layout, Layout]
    """(initiator's, peer's)."""
    entries: tuple[int, int]
    """Copies in each list (what NIXL holds prepared)."""
    initiator: str = "source"
    """"source" (WRITE, push) or "destination" (READ, pull)."""


def prepare(local: Endpoint, remote_metadata: bytes, pattern: TransferPattern,
            remote_addresses: Addresses, remote_device: int = 0, *, strided: bool = True,
            initiator: str = "source", local_mem_type: str | None = None,
            remote_mem_type: str | None = None, peer: str | None = None) -> Prepared:
    """Both sides' lists prepared on the initiator's agent (`local`): the source's to WRITE
    (push), or with `initiator="destination"` the destination's to READ (pull). Each list has
    one memory type (default: the endpoint's). `peer`: the remote agent's name when it was
    added already (one add_remote_agent per peer agent, however many lists)."""
    if initiator not in ("source", "destination"):
        raise TransferCheckError(f"initiator: expected 'source' (push) or 'destination' "
                                 f"(pull), got {initiator!r}")
    if peer is None:
        peer = local.agent.add_remote_agent(remote_metadata)
    other = "destination" if initiator == "source" else "source"
    ours, theirs = layout(pattern, initiator), layout(pattern, other)
    lists = [entries(pattern, initiator, local.addresses, local.device),
             entries(pattern, other, remote_addresses, remote_device)]
    if not strided:
        lists = [dense(found) for found in lists]
    mine = local.agent.prep_xfer_dlist("NIXL_INIT_AGENT", lists[0],
                                       local_mem_type or local.mem_type)
    far = local.agent.prep_xfer_dlist(peer, lists[1], remote_mem_type or local.mem_type)
    return Prepared(pattern, mine, far, peer, (ours[0], theirs[0]), (ours[1], theirs[1]),
                    initiator)


def indices(prepared: Prepared, request: Instantiated) -> tuple[NDArray[np.int32],
                                                                 NDArray[np.int32]]:
    """The request's copies in each list, (initiator's, peer's) (numpy, no loop per block or
    row)."""
    found = []
    ids = (request.src_ids, request.dst_ids)
    if prepared.initiator == "destination":
        ids = ids[::-1]
    for side, ids_ in zip(prepared.layouts, ids, strict=True):
        rows = request.rows
        link = side.link[rows]
        base = side.start[link] + ids_ * side.per_block[link] + side.first[rows]
        count = side.count[rows]
        if count.size and int(count.max()) > 1:
            total = int(count.sum())
            base = np.repeat(base, count) + (
                np.arange(total) - np.repeat(np.cumsum(count) - count, count))
        found.append(base.astype(np.int32))
    return found[0], found[1]


def make(source: Endpoint, prepared: Prepared, request: Instantiated,
         notification: bytes = b"transfer done") -> Any:  # noqa: ANN401
    """The request's NIXL transfer handle (make_prepped_xfer) on the initiator's endpoint
    (`source`, or the destination's for a pull), ready to post: WRITE from the source, or
    READ into the destination; `notification` reaches the peer when it is done."""
    if request.pattern is not prepared.pattern:
        raise TransferCheckError("the request was instantiated from another pattern than "
                                 "the lists were prepared for")
    local, remote = indices(prepared, request)
    # No merging pass: the pattern's rows are already as few and as long as the two
    # layouts allow (coalesced once), and NIXL's pass over every copy costs several times
    # the rest of the post (nixl-cu12 1.5.1 on loopback: ~130 ns a copy against ~20).
    operation = "WRITE" if prepared.initiator == "source" else "READ"
    return source.agent.make_prepped_xfer(operation, prepared.local, local, prepared.remote,
                                          remote, notification, skip_desc_merge=True)


def post(source: Endpoint, prepared: Prepared, request: Instantiated, *,
         timeout_s: float = 60.0) -> int:
    """Write the request's rows and wait until NIXL says done; returns the copies posted."""
    run_to_done(source, make(source, prepared, request), timeout_s=timeout_s)
    return request.chunks
