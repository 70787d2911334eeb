"""Live memory against its plan, before anything is registered (docs/connector.md#binding).

vLLM hands a connector two things: the `KVCacheConfig` its scheduler and workers run on, and
(to a worker's `register_kv_caches`) one tensor per layer. A connector that posts a proved
pattern must know both are the plan's, or the proof says nothing about the bytes it moves:

- `plan_for_live_config`: the plan of a live `KVCacheConfig`. vLLM sizes the pool after the
  plan request is written (it measures memory), so the request is planned again for the
  config's `num_blocks` (`num_blocks_override`) and `to_kv_cache_config(plan)` must equal the
  live config, field for field; the first field that differs is refused with both values.
- `bind_vllm_tensors`: each tensor's address, shape, byte strides and dtype against the plan's
  view of its layer (`hisparse_plan.views`); a mismatch is refused naming the layer and both
  values. The tensors need only be duck-typed like torch's (`data_ptr`, `shape`, `stride`,
  `element_size`, `dtype`): this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from hisparse_plan.adapters.vllm.kv_cache_config import to_kv_cache_config
from hisparse_plan.connectors.errors import BindingError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.targets.vllm import plan as make_plan
from hisparse_plan.views import LayerView, plan_views, shared_views


class TensorLike(Protocol):
    """What binding reads of a torch tensor."""

    @property
    def shape(self) -> Any: ...  # noqa: ANN401
    @property
    def dtype(self) -> Any: ...  # noqa: ANN401
    def data_ptr(self) -> int: ...
    def stride(self) -> Any: ...  # noqa: ANN401
    def element_size(self) -> int: ...
    def dim(self) -> int: ...
    def numel(self) -> int: ...


def plan_for_live_config(request: PlanRequest, live: Any,  # noqa: ANN401
                         tensor_parallel_size: int | None = None) -> KVCachePlan:
    """The plan of `request` for the live config's `num_blocks`, proved to be the live config
    (`to_kv_cache_config(plan) == live`), or BindingError naming the first field that
    differs with both values."""
    num_blocks = getattr(live, "num_blocks", None)
    if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
        raise BindingError(f"kv_cache_config.num_blocks: expected a positive block count, got "
                           f"{num_blocks!r}", field="num_blocks")
    device = request.device.model_copy(update={"num_blocks_override": num_blocks})
    replanned = PlanRequest.model_validate(
        request.model_copy(update={"device": device}).model_dump())
    plan = make_plan(replanned)
    check_live_config(plan, live, tensor_parallel_size)
    return plan


def check_live_config(plan: KVCachePlan, live: Any,  # noqa: ANN401
                      tensor_parallel_size: int | None = None) -> None:
    """`to_kv_cache_config(plan)` equal to `live`, or BindingError at the first difference."""
    specs = live_layer_specs(live)
    ours = scheduler_view(to_kv_cache_config(plan, specs,
                                             tensor_parallel_size=tensor_parallel_size), live)
    difference = first_difference(ours, live, "kv_cache_config")
    if difference is not None:
        where, expected, got = difference
        raise BindingError(f"{where}: the live KVCacheConfig has {got!r}; the plan gives "
                           f"{expected!r}. Expected the config of the plan the connector was "
                           "given (docs/connector.md#binding)", field=where)


def scheduler_view(ours: Any, live: Any) -> Any:  # noqa: ANN401
    """Our config as the scheduler sees it when `live` is the scheduler's: vLLM's engine core
    hands its scheduler (and so the scheduler's connector) not a worker's config but
    `generate_scheduler_kv_cache_config` of them (vllm/v1/core/kv_cache_utils.py), where a
    uniform-type group's spec is replaced by its first member's. Where a live group's spec
    has no members and ours has, ours is replaced the same way; a worker's config (members
    kept) is compared whole."""
    live_groups = list(getattr(live, "kv_cache_groups", ()))
    groups = list(getattr(ours, "kv_cache_groups", ()))
    if len(live_groups) != len(groups):
        return ours
    found = copy.deepcopy(ours)
    for mine, theirs in zip(found.kv_cache_groups, live_groups, strict=True):
        members = getattr(mine.kv_cache_spec, "kv_cache_specs", None)
        if isinstance(members, Mapping) and members and not hasattr(
                theirs.kv_cache_spec, "kv_cache_specs"):
            mine.kv_cache_spec = next(iter(members.values()))
    return found


def live_layer_specs(live: Any) -> dict[str, Any]:  # noqa: ANN401
    """Each layer's own spec in the live config (a uniform-type group's member spec)."""
    found: dict[str, Any] = {}
    for group in getattr(live, "kv_cache_groups", ()):
        spec = group.kv_cache_spec
        members = getattr(spec, "kv_cache_specs", None)
        for name in group.layer_names:
            found[name] = members[name] if isinstance(members, Mapping) else spec
    return found


def first_difference(expected: object, got: object, where: str
                     ) -> tuple[str, object, object] | None:
    """The first (path, expected, got) where two values differ: dataclasses field by field,
    lists item by item, anything else by ==."""
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        if type(expected) is not type(got):
            return where, type(expected).__name__, type(got).__name__
        for field in dataclasses.fields(expected):
            found = first_difference(getattr(expected, field.name), getattr(got, field.name),
                                     f"{where}.{field.name}")
            if found is not None:
                return found
        return None
    if isinstance(expected, list | tuple) and isinstance(got, list | tuple):
        if len(expected) != len(got):
            return f"{where} (length)", len(expected), len(got)
        for index, (mine, theirs) in enumerate(zip(expected, got, strict=True)):
            found = first_difference(mine, theirs, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    return None if expected == got else (where, expected, got)


def region_of(plan: KVCachePlan, view: LayerView) -> str:
    """The transfer's region (the plan's pool) a layer's view lies in."""
    return plan.tensors[view.tensor].pool


def bind_vllm_tensors(plan: KVCachePlan, tensors: Mapping[str, TensorLike]
                      ) -> dict[str, tuple[int, int]]:
    """Each region's (base address, bytes) from the tensors vLLM hands `register_kv_caches`,
    every tensor checked against its layer's view: its dtype, shape and byte strides, and its
    address one base per pool. A tensor of a layer vLLM gives no view of (HiSparse's hot
    pages: the whole buffer, 1-D) must be its pool's whole buffer."""
    views = plan_views(plan)
    views.update(shared_views(plan, views))
    unknown = sorted(set(tensors) - set(views))
    if unknown:
        raise BindingError(f"register_kv_caches: layers {unknown[:5]} are placed by no tensor "
                           "of the plan; expected the plan's layers only", layer=unknown[0])
    missing = sorted(name for name in views if name not in tensors)
    if missing:
        raise BindingError(f"register_kv_caches: no tensor for layers {missing[:5]} the plan "
                           "places; expected one per layer", layer=missing[0])
    sizes = {pool.name: pool.size for pool in plan.pools}
    bases: dict[str, tuple[int, str]] = {}
    for name, tensor in tensors.items():
        view = views[name]
        region = region_of(plan, view)
        if tensor.dim() == 1 and len(view.shape) != 1:
            _whole_buffer(name, tensor, sizes[region])
            base = tensor.data_ptr()
        else:
            _check_view(name, view, tensor)
            base = tensor.data_ptr() - view.offset
        known = bases.setdefault(region, (base, name))
        if known[0] != base:
            raise BindingError(
                f"layer {name!r}: its tensor puts region {region!r} at address {base:#x}; "
                f"layer {known[1]!r}'s at {known[0]:#x}. Expected one allocation per pool, "
                "as the plan places it", layer=name)
    return {region: (base, sizes[region]) for region, (base, _) in bases.items()}


def _whole_buffer(name: str, tensor: TensorLike, size: int) -> None:
    got = tensor.numel() * tensor.element_size()
    if got < size:
        raise BindingError(f"layer {name!r}: vLLM hands the whole buffer, {got} bytes; the "
                           f"plan's pool is {size}", layer=name)


def _check_view(name: str, view: LayerView, tensor: TensorLike) -> None:
    itemsize = tensor.element_size()
    dtype = str(tensor.dtype).removeprefix("torch.")
    got: dict[str, object] = {
        "dtype": dtype, "shape": tuple(int(extent) for extent in tensor.shape),
        "byte strides": tuple(int(stride) * itemsize for stride in tensor.stride())}
    expected: dict[str, object] = {
        "dtype": view.dtype, "shape": tuple(view.shape), "byte strides": tuple(view.strides)}
    if expected["dtype"] == "uint8" and dtype == "int8":
        got["dtype"] = "uint8"  # vLLM's raw byte pages are int8 (_allocate_kv_cache_buffer)
    for what, value in expected.items():
        if got[what] != value:
            raise BindingError(f"layer {name!r}: its tensor's {what} is {got[what]}; the "
                               f"plan's view of the layer has {value}", layer=name)
