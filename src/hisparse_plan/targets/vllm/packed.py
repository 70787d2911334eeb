"""Packed groups for block-outermost layouts with mixed pages (SPEC 7.3.1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hisparse_plan.errors import PlanError
from hisparse_plan.models import MambaSpec, SlidingWindowMLASpec, SlidingWindowSpec
from hisparse_plan.rules.arith import ceil_div
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import Layer, PlannedGroup, uniform_group
from hisparse_plan.targets.vllm.rules.families import FamilyKey, family_key, keys_joined_by


@dataclass(slots=True)
class _Bucket:
    """Layers of one family (led by the first), with their layers by page."""

    layers: list[Layer] = field(default_factory=list)
    by_page: dict[int, list[Layer]] = field(default_factory=dict)

    @property
    def balanced(self) -> bool:
        return len({len(names) for names in self.by_page.values()}) == 1

    @property
    def most(self) -> int:
        """m: the largest number of layers sharing one page."""
        return max(len(names) for names in self.by_page.values())

    @property
    def leader(self) -> Layer:
        return self.layers[0]

    def widest(self, groups: int) -> int:
        """One block of this bucket's widest group when split into `groups`."""
        return sum(ceil_div(len(names), groups) * page for page, names in self.by_page.items())


def packed_groups(layers: Sequence[Layer], trace: Trace) -> list[PlannedGroup]:
    buckets = family_buckets(layers)
    balanced = [bucket for bucket in buckets if bucket.balanced]
    repeats = pattern_repeats(balanced)
    trace.add("group", "7.3.1 step 3", "repeats", repeats,
              lambda: f"{len(buckets)} buckets, {len(balanced)} balanced")

    def groups_for(bucket: _Bucket) -> int:
        if repeats is None or not bucket.balanced:
            return 1
        return ceil_div(bucket.most, repeats)

    def is_state(bucket: _Bucket) -> bool:
        spec = bucket.leader[1]
        windowed = isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec)
        return isinstance(spec, MambaSpec) or (repeats is None and windowed)

    anchor = max(
        bucket.widest(len(bucket.layers) if is_state(bucket) else groups_for(bucket))
        for bucket in buckets
    )
    groups: list[PlannedGroup] = []
    for bucket in buckets:
        count = groups_for(bucket)
        if is_state(bucket) and anchor > 0:
            per_block = max(anchor // bucket.leader[1].page_size_bytes, 1)
            count = max(count, ceil_div(len(bucket.layers), per_block))
        if trace.enabled:
            trace.add("group", "7.3.1 step 7", f"bucket {bucket.leader[0]!r}", count,
                      f"{len(bucket.layers)} layers, {len(bucket.by_page)} pages, anchor "
                      f"{anchor} -> {count} group(s)")
        groups.extend(_split(bucket, count))
    return groups


def family_buckets(layers: Sequence[Layer]) -> list[_Bucket]:
    """Step 1: each layer joins the first bucket whose leader's family takes it."""
    buckets: list[_Bucket] = []
    first_of_key: dict[FamilyKey, int] = {}
    bucket_of: dict[int, int] = {}  # by spec identity: one spec always joins one bucket
    for layer in layers:
        spec = layer[1]
        index = bucket_of.get(id(spec))
        if index is None:
            found = [first_of_key[key] for key in keys_joined_by(spec) if key in first_of_key]
            if found:
                index = min(found)
            else:
                index = len(buckets)
                buckets.append(_Bucket())
                first_of_key[family_key(spec)] = index
            bucket_of[id(spec)] = index
        bucket = buckets[index]
        bucket.layers.append(layer)
        bucket.by_page.setdefault(spec.page_size_bytes, []).append(layer)
    return buckets


def pattern_repeats(balanced: list[_Bucket]) -> int | None:
    """Step 3: how many layers of each page a packed group repeats; None when no balanced
    bucket mixes pages."""
    floor = max((b.most for b in balanced if len(b.by_page) > 1), default=0)
    if floor == 0:
        return None
    counts = [b.most for b in balanced]
    best, best_waste = floor, None
    for d in range(floor, max(counts) + 1):
        waste = sum((d - m % d) % d for m in counts)
        if best_waste is None or waste <= best_waste:
            best, best_waste = d, waste
    return best


def _split(bucket: _Bucket, count: int) -> list[PlannedGroup]:
    """Step 7 and 8: one group of the bucket, or `count` groups taking every count-th repeat."""
    if count == 1:
        return [uniform_group(bucket.layers)]
    lists = list(bucket.by_page.values())
    repeats = min(len(names) for names in lists)
    if count > repeats:
        raise PlanError(
            f"layers[{bucket.leader[0]!r}]: its packed bucket would split into {count} groups "
            f"but its page pattern repeats only {repeats} time(s), so a group would be empty "
            "(see docs/planning-rules.md#packed-groups; vLLM 0.33 fails here)",
            field=f"layers[{bucket.leader[0]!r}]",
        )
    lost = next((names[repeats] for names in lists if len(names) > repeats), None)
    if lost is not None:
        raise PlanError(
            f"layers[{lost[0]!r}]: its bucket (led by {bucket.leader[0]!r}) is unbalanced "
            f"({_page_counts(bucket)}) and splits "
            f"into {count} groups of {repeats} pattern repeats, which leaves this layer in no "
            "group (see docs/planning-rules.md#packed-groups; vLLM 0.33 fails here); expected a "
            "balanced bucket",
            field=f"layers[{lost[0]!r}]",
        )
    groups = []
    for i in range(count):
        members = [names[j] for j in range(i, repeats, count) for names in lists]
        groups.append(uniform_group(members))
    return groups


def _page_counts(bucket: _Bucket) -> str:
    counts = [f"{len(names)} x {page} B" for page, names in bucket.by_page.items()]
    return ", ".join(counts[:4]) + (f", ... ({len(counts)} pages)" if len(counts) > 4 else "")
