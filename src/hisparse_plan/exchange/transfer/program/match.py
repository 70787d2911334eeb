"""Match layers: every layer the destination holds must come from a layer of the source with
the same row, or the transfer is refused before any byte moves, naming the layer and the field
with both values (see docs/transfer.md#what-is-refused). Each rule is one function."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from hisparse_plan.exchange.transfer.errors import TransferRefused, refuse_difference
from hisparse_plan.exchange.transfer.facts.dcp import context_size
from hisparse_plan.exchange.transfer.facts.heads import global_heads
from hisparse_plan.exchange.transfer.facts.rank_facts import FieldPlace, LayerFacts, RankFacts
from hisparse_plan.exchange.transfer.facts.sharing import same_sharing
from hisparse_plan.exchange.transfer.facts.side import FP8_FORMATS, Instance
from hisparse_plan.exchange.transfer.facts.states import StateSplit, state_splits


@dataclass(frozen=True, slots=True)
class LayerPair:
    """A layer both sides hold, with what the pairing decided."""

    name: str
    source: LayerFacts
    destination: LayerFacts
    window: int | None
    """Tokens the destination still needs of a window layer (None: every token)."""
    states: tuple[StateSplit, ...] | None = None
    """A state layer between TP sizes: each state's split (None: rank to rank)."""


def match_layers(source: Instance, destination: Instance) -> list[LayerPair]:
    """The layers to move, in the destination's order, each proved movable as bytes."""
    context_ranks(source, "source")
    context_ranks(destination, "destination")
    src_ranks, dst_ranks = source.facts, destination.facts
    stages_apart(src_ranks, "source")
    stages_apart(dst_ranks, "destination")
    src, dst = stage_layers(src_ranks), stage_layers(dst_ranks)
    same_sharing(source, destination)
    present_on_both(src, dst)
    pairs = []
    for name, theirs in dst.items():
        ours = src[name]
        movable(ours, theirs)
        same_kind(ours, theirs)
        same_page_tokens(ours, theirs)
        src_tp, dst_tp = len(source.group(name)), len(destination.group(name))
        resharded = ours.kind == "state" and src_tp != dst_tp
        same_row(ours, theirs, shapes=not resharded)
        same_fp8_format(ours, theirs, source, destination)
        splits = None
        if resharded:
            splits = state_splits(ours, theirs, src_tp, dst_tp,
                                  same_state_groups(name, source, destination))
        else:
            same_heads(ours, theirs, source, destination)
        pairs.append(LayerPair(name, ours, theirs, window_of(ours, theirs, source, destination),
                               splits))
    return pairs


def context_ranks(side: Instance, what: str) -> None:
    """Decode context parallelism: a vLLM decode's DCP ranks each hold a strided set of the
    request's tokens (facts/context.py), and rows move into them. Refused, naming the field:
    a source with DCP (its ranks' token sets would have to be matched to the destination's:
    not done), an SGLang side with DCP (SGLang 0.5.23 shards the latent rows over token ids
    `dcp_size` apart and keeps the index keys whole; its page ids are not modelled here), and
    plans of one instance with other DCP sizes."""
    sizes = [context_size(plan) for plan in side.plans]
    for rank, (dcp, where, movable) in enumerate(sizes):
        reason = None
        if dcp != sizes[0][0]:
            reason = f"expected every rank's DCP size, {sizes[0][0]}"
        elif dcp > 1 and what == "source":
            reason = "expected 1: a source with decode context parallelism is not moved"
        elif dcp > 1 and not movable:
            reason = (f"expected 1: the {side.plans[rank].engine} plan's decode context "
                      "parallelism is not moved")
        if reason is not None:
            raise TransferRefused(
                f"{what} rank {rank}: decode_context_parallel_size is {dcp}; {reason} (see "
                "docs/transfer.md#decode-context-parallelism)",
                what="decode_context_parallel_size", source=dcp if what == "source" else None,
                destination=dcp if what == "destination" else None,
                field=f"{what}.plans[{rank}].{where}")


def stages_apart(ranks: tuple[RankFacts, ...], side: str) -> None:
    """The ranks of one pipeline stage place the same layers, and two stages none in common
    (SGLang's pipeline ranks plan their own layers; a vLLM plan holds every stage)."""
    for rank, facts in enumerate(ranks):
        for other in ranks[:rank]:
            mine, theirs = set(facts.layers), set(other.layers)
            if mine != theirs and mine & theirs:
                common = min(mine & theirs)
                raise TransferRefused(
                    f"{side} rank {rank}: its plan places layer {common!r} as an earlier "
                    "rank does, and other layers besides; expected the ranks of one pipeline "
                    "stage to place the same layers, and two stages none in common",
                    layer=common, what="layers", field=f"{side}.plans[{rank}]",
                )


def stage_layers(ranks: tuple[RankFacts, ...]) -> dict[str, LayerFacts]:
    """Every layer the instance holds, from the first rank that holds it, in stage order."""
    found: dict[str, LayerFacts] = {}
    for facts in ranks:
        for name, layer in facts.layers.items():
            found.setdefault(name, layer)
    return found


def present_on_both(src: dict[str, LayerFacts], dst: dict[str, LayerFacts]) -> None:
    """A layer missing on one side has nowhere to come from or to go."""
    for name in dst:
        if name not in src:
            raise refuse_difference(name, "present", False, True,
                                    "the destination holds a layer the source does not")
    for name in src:
        if name not in dst:
            raise refuse_difference(name, "present", True, False,
                                    "the source holds a layer the destination does not")


def movable(src: LayerFacts, dst: LayerFacts) -> None:
    for side, layer in (("source", src), ("destination", dst)):
        if layer.unsupported is not None:
            raise TransferRefused(
                f"layer {layer.name!r}: the {side} keeps it as {layer.unsupported}, which this "
                "version does not move (see docs/transfer.md#what-is-refused)",
                layer=layer.name, what="kind", field=f"layers[{layer.name!r}]",
            )


def same_kind(src: LayerFacts, dst: LayerFacts) -> None:
    if src.kind != dst.kind:
        raise refuse_difference(src.name, "kind", src.kind, dst.kind,
                                "rows, pages and states do not hold the same bytes")


def same_row(src: LayerFacts, dst: LayerFacts, *, shapes: bool = True) -> None:
    """Another dtype or row format is not the same bytes: the fields (K, V, latent, index
    page, states) must match in name, bytes, dtype and state shape, and the cache format where
    both plans name one. Without `shapes` (states between TP sizes, whose shards differ) the
    shapes and bytes are left to the states' split."""
    if src.fmt is not None and dst.fmt is not None and src.fmt != dst.fmt:
        raise refuse_difference(src.name, "cache_dtype", src.fmt, dst.fmt,
                                "rows of another format are not the same bytes")
    ours = [(f.name, f.size, f.dtype, f.shape) for f in src.fields]
    theirs = [(f.name, f.size, f.dtype, f.shape) for f in dst.fields]
    if [f[0] for f in ours] != [f[0] for f in theirs]:
        raise refuse_difference(src.name, "fields", [f[0] for f in ours],
                                [f[0] for f in theirs], "the rows are made of other parts")
    for (field, size, dtype, shape), (_, size2, dtype2, shape2) in zip(ours, theirs,
                                                                        strict=True):
        if not shapes:
            size2, shape2 = size, shape
        if shape != shape2:
            raise refuse_difference(src.name, f"{field}.shape", list(shape), list(shape2),
                                    "states of another shape are not the same bytes")
        if dtype != dtype2:
            raise refuse_difference(src.name, f"{field}.dtype", dtype, dtype2,
                                    "another dtype is not the same bytes")
        if size != size2:
            raise refuse_difference(src.name, f"{field}.bytes", size, size2,
                                    "rows of another size are not the same bytes")


FP8_STORED_FIELDS = frozenset({"k", "v", "latent"})
"""Row fields an fp8 cache stores as uint8 (index keys and states are one format in both
engines)."""
NAMED_FORMATS = {"fp8_ds_mla": "fp8_e4m3"}
"""A format a plan names -> the fp8 its rows hold (FlashMLA's packed rows are e4m3)."""


def same_fp8_format(src: LayerFacts, dst: LayerFacts, source: Instance, destination: Instance
                    ) -> None:
    """Rows of an fp8 cache are uint8 in both engines' plans, e4m3 or e5m2 alike, unless the
    plan names the format (fp8_ds_mla): moving them between unlike fp8s would pass every byte
    check and corrupt every value, so a side whose plan does not name it must say which fp8
    it runs (Instance.cache_dtype), and both sides the same one."""
    if not any(field.dtype == "uint8" and field.name in FP8_STORED_FIELDS
               for field in (*src.fields, *dst.fields)):
        return
    formats = []
    for layer, side, what in ((src, source, "source"), (dst, destination, "destination")):
        declared = None if side.cache_dtype is None else FP8_FORMATS[side.cache_dtype]
        named = None if layer.fmt is None else NAMED_FORMATS.get(layer.fmt)
        if named is not None and declared is not None and declared != named:
            raise TransferRefused(
                f"layer {layer.name!r}: the {what} plan's rows are {layer.fmt} ({named}), but "
                f"its instance says cache_dtype {side.cache_dtype!r}; expected the two to "
                "agree (see docs/transfer.md#what-is-refused)",
                layer=layer.name, what="cache_dtype", field="cache_dtype",
                source=source.cache_dtype, destination=destination.cache_dtype)
        formats.append(named or declared)
    unknown = [what for what, found in zip(("source", "destination"), formats, strict=True)
               if found in (None, "auto")]
    if unknown:
        raise TransferRefused(
            f"layer {src.name!r}: its rows are an fp8 cache stored as uint8, and the "
            f"{' and '.join(unknown)} plan does not say whether they hold e4m3 or e5m2; "
            f"expected cache_dtype fp8_e4m3 or fp8_e5m2 on the {' and '.join(unknown)} "
            f"instance, got {source.cache_dtype!r} and {destination.cache_dtype!r} (see "
            "docs/transfer.md#what-is-refused)",
            layer=src.name, what="cache_dtype", source=source.cache_dtype,
            destination=destination.cache_dtype, field="cache_dtype",
        )
    if formats[0] != formats[1]:
        raise refuse_difference(src.name, "cache_dtype", formats[0], formats[1],
                                "another fp8 is not the same bytes")


def same_page_tokens(src: LayerFacts, dst: LayerFacts) -> None:
    """Index keys are laid out per page (the page's keys, then their scales): a page of
    another size is another arrangement of the same keys."""
    if src.kind == "pages" and src.tokens_per_unit != dst.tokens_per_unit:
        raise refuse_difference(src.name, "block_size", src.tokens_per_unit,
                                dst.tokens_per_unit,
                                "index keys are laid out per page, keys then scales")


def same_state_groups(layer: str, source: Instance, destination: Instance
                      ) -> tuple[int, ...] | None:
    """The conv state's channel blocks, as either instance gives them (both: the same)."""
    ours, theirs = source.state_groups, destination.state_groups
    if ours is not None and theirs is not None and ours != theirs:
        raise refuse_difference(layer, "state_groups", list(ours), list(theirs),
                                "the sides' conv states are made of other blocks")
    return ours if ours is not None else theirs


def same_heads(src: LayerFacts, dst: LayerFacts, source: Instance, destination: Instance
               ) -> None:
    """Both sides hold the model's same heads in all (their split may differ)."""
    ours = global_heads(src, len(source.group(src.name)), source.total_kv_heads)
    theirs = global_heads(dst, len(destination.group(dst.name)), destination.total_kv_heads)
    if ours != theirs:
        raise refuse_difference(src.name, "num_kv_heads (all ranks)", ours, theirs,
                                "the sides hold other heads of the model")


def window_of(src: LayerFacts, dst: LayerFacts, source: Instance, destination: Instance
              ) -> int | None:
    """The window of a sliding-window layer: the plans' (they must agree), else the one the
    instance gives; a window layer with no known window is refused."""
    if not (src.windowed or dst.windowed):
        return None
    known = [
        window for window in (
            src.window, dst.window, source.windows.get(src.name),
            destination.windows.get(src.name),
        ) if window is not None
    ]
    if not known:
        raise TransferRefused(
            f"layer {src.name!r}: a sliding-window layer whose window neither plan records "
            "(SGLang's swa pool); give it as Instance(windows={name: tokens}) (see "
            "docs/transfer.md#sliding-windows)",
            layer=src.name, what="sliding_window", field=f"windows[{src.name!r}]",
        )
    if any(window != known[0] for window in known):
        raise refuse_difference(src.name, "sliding_window", known[0],
                                next(w for w in known if w != known[0]),
                                "the sides attend to other windows")
    # Where one side keeps every block (a window promoted to full blocks), the other still
    # needs only the window.
    return known[0]


def contiguous_runs(fields: tuple[FieldPlace, ...]) -> list[tuple[int, int, FieldPlace]]:
    """The row's fields merged where one follows the other in one region with the same
    strides: (first logical byte, stop, the first field's place)."""
    runs: list[tuple[int, int, FieldPlace]] = []
    for field in fields:
        if runs:
            lo, hi, first = runs[-1]
            follows = (
                field.region == first.region and field.base == first.base + (hi - lo)
                and field.lo == hi
                and (field.block_stride, field.unit_stride, field.head_stride)
                == (first.block_stride, first.unit_stride, first.head_stride)
            )
            if follows:
                runs[-1] = (lo, hi + field.size, first)
                continue
        runs.append((field.lo, field.lo + field.size, field))
    return runs


def segments(src: LayerFacts, dst: LayerFacts) -> list[tuple[int, int, FieldPlace, int,
                                                              FieldPlace, int]]:
    """The logical row cut where either side's contiguous runs break: (lo, hi, source place,
    its run's first logical byte, destination place, its run's first byte). Only bytes both
    sides hold: a state's pieces on ranks of two TP sizes hold parts of the row."""
    ours, theirs = contiguous_runs(src.fields), contiguous_runs(dst.fields)
    cuts = sorted({lo for lo, _, _ in ours} | {lo for lo, _, _ in theirs}
                  | {hi for _, hi, _ in ours} | {hi for _, hi, _ in theirs})
    found = []
    for lo, hi in pairwise(cuts):
        mine = next((run for run in ours if run[0] <= lo < run[1]), None)
        yours = next((run for run in theirs if run[0] <= lo < run[1]), None)
        if mine is not None and yours is not None:
            found.append((lo, hi, mine[2], mine[0], yours[2], yours[0]))
    return found
