"""Coalesce rows: adjacent runs become one row (see docs/transfer.md#rows).

Rules, applied to rows sorted by their source (then, separately, by their destination)
bytes, repeated until nothing changes, the fewer rows kept:
- contiguous: a row whose chunks end where the next row's begin, on both sides, with the
  same count and strides, takes the next row's bytes into its chunks (where the logical
  bytes do not follow on, as from one tensor of a block's slab to the next, the row is
  composite: it joins nothing further but the next contiguous row);
- progression: rows of one length that step by one stride on both sides become one row with
  a count.
A progression also needs the logical bytes to follow on: one chunk's box continued along one
dimension (layers, units, heads or row bytes), so its chunks move boxes of logical bytes in
one order. With blocks outermost on both sides and one layout, a run of consecutive blocks
ends up one row of contiguous chunks (one descriptor); a layer-outermost side costs one row
per layer per run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hisparse_plan.exchange.transfer.program.lower import ZERO, Row, Vector, add, grown, tiles

COMPOSITE: Vector = (0, 0, 0, 0)
"""The extent of a row whose chunks run through several tensors (a block-outermost slab):
no one box, so it joins nothing further but the next contiguous row."""


def normalized(row: Row) -> Row:
    """A row whose chunks follow one another on both sides, and logically, is one chunk."""
    if row.chunks > 1 and row.src_stride == row.length == row.dst_stride \
            and row.extent != COMPOSITE:
        dimension = tiles(row.step, row.extent)
        if dimension is not None:
            return row._replace(length=row.length * row.chunks, chunks=1, src_stride=0,
                                dst_stride=0, step=ZERO,
                                extent=grown(row.extent, dimension, row.chunks))
    return row


def _continues(a: Row, b: Row) -> int | None:
    """The dimension along which b's chunk box continues a's (equal elsewhere), or None."""
    if COMPOSITE in (a.extent, b.extent):
        return None
    dimension = tiles(add(b.start, a.start, -1), a.extent)
    if dimension is None:
        return None
    if any(a.extent[i] != b.extent[i] for i in range(4) if i != dimension):
        return None
    return dimension


def widened(a: Row, b: Row) -> Row | None:
    """Contiguous: each chunk of `a` followed by the same chunk of `b` on both sides."""
    if b.src_offset != a.src_offset + a.length or b.dst_offset != a.dst_offset + a.length:
        return None
    if a.chunks != b.chunks or (a.chunks > 1 and (a.src_stride, a.dst_stride)
                                != (b.src_stride, b.dst_stride)):
        return None
    dimension = _continues(a, b) if a.step == b.step else None
    if dimension is None:
        # The bytes follow on both sides but the logical bytes do not: where a later layer
        # begins (the next tensor of a block's slab), still one row, proved piece by piece;
        # within one layer, never (its units would run out of order).
        if b.start[0] <= a.last:
            return None
        return a._replace(length=a.length + b.length, extent=COMPOSITE, last=b.last)
    values = list(a.extent)
    values[dimension] += b.extent[dimension]
    extent = (values[0], values[1], values[2], values[3])
    if a.chunks > 1 and tiles(a.step, extent) is None:
        return None
    return a._replace(length=a.length + b.length, extent=extent, last=b.last)


def progressed(a: Row, b: Row) -> Row | None:
    """Progression: `b`'s chunks continue `a`'s by one stride on both sides, and logically."""
    if a.length != b.length or a.extent != b.extent or a.extent == COMPOSITE:
        return None
    if a.chunks == 1:
        src_step, dst_step = b.src_offset - a.src_offset, b.dst_offset - a.dst_offset
        step = add(b.start, a.start, -1)
        # A step along the row's bytes leaves the chunk's part of the row (K for V, one
        # state for the next): a row's chunks stay in one part.
        if src_step < a.length or dst_step < a.length or tiles(step, a.extent) in (None, 3):
            return None
    else:
        src_step, dst_step, step = a.src_stride, a.dst_stride, a.step
        if b.src_offset != a.src_offset + a.chunks * src_step \
                or b.dst_offset != a.dst_offset + a.chunks * dst_step \
                or b.start != add(a.start, step, a.chunks):
            return None
    if b.chunks > 1 and (b.src_stride, b.dst_stride, b.step) != (src_step, dst_step, step):
        return None
    return a._replace(chunks=a.chunks + b.chunks, src_stride=src_step, dst_stride=dst_step,
                      step=step)


def _pass(rows: list[Row], key: Callable[[Row], tuple[int | str, ...]],
          tables: Mapping[str, object]) -> list[Row]:
    out: list[Row] = []
    for row in sorted(rows, key=key):
        row = normalized(row)
        if out:
            last = out[-1]
            # Two block tables may hold one pool's blocks (vLLM's groups): a row joined across
            # them would read blocks of one table as the other's.
            same = (last.src_rank, last.src_region, last.dst_rank, last.dst_region) == \
                (row.src_rank, row.src_region, row.dst_rank, row.dst_region) \
                and tables.get(last.layer) == tables.get(row.layer)
            joined = (widened(last, row) or progressed(last, row)) if same else None
            if joined is not None:
                out[-1] = normalized(joined)
                continue
        out.append(row)
    return out


def _by_source(row: Row) -> tuple[int | str, ...]:
    return (row.src_rank, row.dst_rank, row.src_region, row.dst_region, row.src_offset)


def _by_destination(row: Row) -> tuple[int | str, ...]:
    return (row.src_rank, row.dst_rank, row.src_region, row.dst_region, row.dst_offset)


def coalesce(rows: list[Row], tables: Mapping[str, object] | None = None) -> list[Row]:
    """The same copy in as few rows as the rules find (sorted by destination bytes when that
    order gives fewer). `tables` gives each layer's block tables (source and destination):
    rows of layers in other tables never join; None: every layer in one table."""
    tables = {} if tables is None else tables
    best: list[Row] | None = None
    for key in (_by_source, _by_destination):
        current = rows
        while True:
            after = _pass(current, key, tables)
            settled = len(after) == len(current)
            current = after
            if settled:
                break
        if best is None or len(current) < len(best):
            best = current
    return best if best is not None else []
