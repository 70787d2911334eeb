"""What the groups mean, re-derived from the plan alone (SPEC 5.4-5.6, 7.2, 7.3).

Bytes can be sound while meaning is wrong: a resident group with a foreign block size, a hot
group sized for one block, roles swapped, transfers switched off. Each check below derives the
expected value from other fields of the plan and names the first group that differs.
"""

from __future__ import annotations

from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.models import (
    HOT_SUFFIX,
    RESIDENT_SUFFIX,
    GroupRole,
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCacheGroup,
    KVCachePlan,
    MLASpec,
    UniformTypeSpec,
)
from hisparse_plan.rules.arith import ceil_div
from hisparse_plan.targets.vllm.rules.families import one_family
from hisparse_plan.targets.vllm.rules.hot import hot_buffer, hot_packs

DERIVED_KINDS = ("hisparse_resident", "hisparse_hot")


def check_meaning(plan: KVCachePlan) -> None:
    for index, group in enumerate(plan.groups):
        _check_family(index, group)
    if plan.host_pool is None:
        for index, group in enumerate(plan.groups):
            _check_flags(index, group, "default", transfer=True)
            if group.spec.kind in DERIVED_KINDS:
                raise PlanInvariantError(
                    f"groups[{index}] is a {group.spec.kind} group in a plan without a host "
                    "pool; expected HiSparse's derived groups only beside a source group",
                    layer=group.layer_names[0],
                )
        return
    _check_hisparse(plan)


def _fail(index: int, group: KVCacheGroup, what: str) -> PlanInvariantError:
    return PlanInvariantError(f"groups[{index}] {what}", layer=group.layer_names[0])


def _check_family(index: int, group: KVCacheGroup) -> None:
    spec = group.spec
    if isinstance(spec, UniformTypeSpec) and not one_family(list(spec.specs.values())):
        raise _fail(index, group, "is a uniform_type group whose members are not one family "
                    "(see docs/planning-rules.md#families); expected members that may share one "
                    "block table")


def _check_flags(index: int, group: KVCacheGroup, role: GroupRole, *, transfer: bool) -> None:
    host = role == "hisparse_source"
    got = (group.role, group.host_resident, group.enable_kv_transfer)
    if got != (role, host, transfer):
        raise _fail(index, group, f"has role {got[0]!r}, host_resident {got[1]}, "
                    f"enable_kv_transfer {got[2]}; expected {role!r}, {host}, {transfer} "
                    "(see docs/planning-rules.md#hisparse-groups, docs/plan-contract.md)")


def _members(index: int, group: KVCacheGroup, cache_role: str) -> list[tuple[str, MLASpec]]:
    spec = group.spec
    if not isinstance(spec, UniformTypeSpec):
        raise _fail(index, group, f"has kind {spec.kind!r}; expected uniform_type over the "
                    f"{cache_role} MLA layers (see docs/planning-rules.md#hisparse-groups)")
    members = []
    for name, member in spec.specs.items():
        if not isinstance(member, MLASpec) or member.cache_role != cache_role:
            role = member.cache_role if isinstance(member, MLASpec) else member.kind
            raise PlanInvariantError(
                f"groups[{index}] holds {name!r} ({role}); expected only MLA layers with "
                f"cache_role {cache_role!r} in this group (see "
                "docs/planning-rules.md#hisparse-groups)",
                layer=name,
            )
        members.append((name, member))
    return members


def _check_hisparse(plan: KVCachePlan) -> None:
    groups = plan.groups
    if len(groups) < 4:
        raise PlanInvariantError(
            f"the plan has a host pool but {len(groups)} groups; expected source, indexer and "
            "at least one resident and one hot group (see docs/planning-rules.md#hisparse-groups)"
        )
    _check_flags(0, groups[0], "hisparse_source", transfer=True)
    _check_flags(1, groups[1], "hisparse_indexer", transfer=True)
    source = _members(0, groups[0], "sparse")
    indexer = _members(1, groups[1], "indexer")
    block_size = groups[0].spec.block_size
    if groups[1].spec.block_size != block_size:
        raise _fail(1, groups[1], f"has block_size {groups[1].spec.block_size}; expected the "
                    f"source group's {block_size} (see docs/planning-rules.md#hisparse-groups)")
    try:
        packs = hot_packs(source, sum(spec.page_size_bytes for _, spec in indexer))
    except PlanError as error:
        # The packs follow the source group's order: a reordered group can mix page sizes.
        raise PlanInvariantError(
            f"groups[0] (hisparse_source) does not pack into resident/hot groups: {error}",
            layer=groups[0].layer_names[0],
        ) from error
    hot_blocks = _hot_blocks(plan, source, block_size)
    expected = [
        *((RESIDENT_SUFFIX, pack, None) for pack in packs),
        *((HOT_SUFFIX, pack, hot_blocks) for pack in packs),
    ]
    for offset, (suffix, pack, blocks) in enumerate(expected):
        index = 2 + offset
        if index >= len(groups):
            raise PlanInvariantError(
                f"the plan has {len(groups)} groups; expected {len(packs)} resident and "
                f"{len(packs)} hot groups after the indexer (see "
                "docs/planning-rules.md#resident-and-hot-packs, #hisparse-groups)"
            )
        _check_derived(index, groups[index], suffix, pack.names, pack.page, block_size, blocks)
    for index in range(2 + len(expected), len(groups)):
        group = groups[index]
        _check_flags(index, group, "default", transfer=True)
        if group.spec.kind in DERIVED_KINDS or isinstance(group.spec, MLASpec) or (
            isinstance(group.spec, UniformTypeSpec)
            and any(isinstance(m, MLASpec) for m in group.spec.specs.values())
        ):
            raise _fail(index, group, f"({group.spec.kind}) comes after the hot groups; expected "
                        "only regular groups of non-MLA layers there (see "
                        "docs/planning-rules.md#hisparse-groups)")


def _hot_blocks(plan: KVCachePlan, source: list[tuple[str, MLASpec]], block_size: int) -> int:
    """Hot blocks per request, from the hot-buffer inputs the plan records (SPEC 5.4)."""
    workload = plan.workload
    index_topk, queries = workload.index_topk, workload.max_decode_query_len
    if index_topk is None or queries is None or workload.device_buffer_size is None:
        raise PlanInvariantError(
            "workload: a HiSparse plan records index_topk, max_decode_query_len and "
            "device_buffer_size; expected all three, got "
            f"{index_topk}, {queries}, {workload.device_buffer_size}"
        )
    try:
        hot = hot_buffer([spec for _, spec in source], index_topk, queries,
                         workload.device_buffer_size, block_size)
    except PlanError as error:
        raise PlanInvariantError(f"workload: {error}") from error
    if workload.top_k != hot.top_k:
        raise PlanInvariantError(
            f"workload.top_k is {workload.top_k}; expected {hot.top_k}, the largest "
            "topk_buffer_width (or index_topk) of the source layers (see "
            "docs/planning-rules.md#hot-buffer)"
        )
    return ceil_div(hot.rows, block_size)


def _check_derived(
    index: int,
    group: KVCacheGroup,
    suffix: str,
    sources: list[str],
    page: int,
    block_size: int,
    hot_blocks: int | None,
) -> None:
    _check_flags(index, group, "default", transfer=False)
    names = [name + suffix for name in sources]
    if group.layer_names != names:
        raise _fail(index, group, f"lists {group.layer_names[:3]}...; expected the pack "
                    f"{names[:3]}... (see docs/planning-rules.md#resident-and-hot-packs: units "
                    "packed in order into indexer blocks)")
    spec = group.spec
    kind = "hisparse_resident" if hot_blocks is None else "hisparse_hot"
    if spec.kind != kind or spec.block_size != block_size or spec.page_size_bytes != page:
        raise _fail(index, group, f"is {spec.kind} with block_size {spec.block_size} and page "
                    f"{spec.page_size_bytes}; expected {kind} with the source block_size "
                    f"{block_size} and the pack's page {page} (see "
                    "docs/planning-rules.md#resident-and-hot-packs)")
    if hot_blocks is not None and isinstance(spec, HisparseHotSpec | HisparseResidentSpec):
        blocks = getattr(spec, "blocks_per_request", None)
        if blocks != hot_blocks:
            raise _fail(index, group, f"holds {blocks} hot blocks per request; expected "
                        f"ceil(device_buffer_size / block_size) = {hot_blocks} (see "
                        "docs/planning-rules.md#hot-buffer)")
