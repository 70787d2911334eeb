"""The kernels' stride rules (targets/vllm/platform/contracts.py) applied by the builder to the
tensors it places, with the backends vLLM selected for the layers: a placement that one of
their kernels would trip on is refused while vLLM plans, before it allocates the KV cache, not
left to `MLAAttention.bind_kv_cache` (vllm/model_executor/layers/attention/mla_attention.py),
whose check fails in every worker, the engine restarting into it again (vllm#55431).

Which backends (what the builder's call can reach of vLLM's objects):
- each layer's own, where vLLM registered the model's attention layers in this process
  (`vllm_config.compilation_config.static_forward_context`; each layer's
  `get_attn_backend().get_name()`, as vLLM's `get_current_attn_backends` in
  vllm/distributed/kv_transfer/kv_connector/utils.py reads them): in a worker, and in the
  engine core when its executor runs the worker in-process (vLLM's `uni` executor);
- else, on CUDA, the backends vLLM 0.34 selects on the GPU `current_platform` reports
  (`get_device_capability`, vllm/platforms/cuda.py), by targets/vllm/platform/selection.py: the
  engine core whose workers are other processes (`mp`, `ray`) holds no layers;
- else (no GPU known, e.g. a CPU test) the rule every GPU's backends share, as `plan()` holds.

vLLM is imported only inside `engine_capability`; the rest takes vLLM's objects as given.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence

from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import KVCacheTensor, LayerSpec, MLASpec
from hisparse_plan.targets.vllm.platform import (
    first_violation,
    layer_contracts,
    selected_backends,
)

Capability = tuple[int, int]
ROLE_KINDS = {"sparse": "sparse_mla", "indexer": "indexer"}
"""A sparse-MLA cache role -> the layer kind selection.py names its backend by."""


def engine_capability() -> Capability | None:
    """The GPU's compute capability as vLLM's platform reports it; None off CUDA (another
    platform's numbers name no CUDA backend)."""
    platforms = importlib.import_module("vllm.platforms")
    platform = platforms.current_platform
    if not platform.is_cuda():
        return None
    found = platform.get_device_capability()
    return None if found is None else (int(found[0]), int(found[1]))


def registered_backends(vllm_config: VllmObject, names: Iterable[str]) -> dict[str, str]:
    """Layer name -> the backend of the attention layer vLLM registered under that name; layers
    not registered in this process are left out."""
    compilation = getattr(vllm_config, "compilation_config", None)
    context = getattr(compilation, "static_forward_context", None) or {}
    found = {}
    for name in names:
        backend_of = getattr(context.get(name), "get_attn_backend", None)
        if backend_of is not None:
            found[name] = str(backend_of().get_name())
    return found


def check_placed_strides(
    vllm_config: VllmObject,
    layers: Mapping[str, LayerSpec],
    tensors: Sequence[KVCacheTensor],
    capability: Capability | None,
) -> None:
    """Refuse `tensors` (the builder's placement of `layers`) at the first block stride a kernel
    of the backends vLLM runs would misread, naming the kernel, the layer, its backend and both
    numbers."""
    backends, how = _backends(vllm_config, layers, capability)
    contracts = layer_contracts(layers, backends, capability)
    found = first_violation(tensors, layers, contracts)
    if found is None:
        return
    backend = None if backends is None else backends.get(ROLE_KINDS[found.contract.role])
    runs = ("the rule every GPU's sparse backends share" if backend is None
            else f"vLLM's {backend} backend, {how}")
    on = "" if capability is None else f" on compute capability {capability[0]}.{capability[1]}"
    raise UnsupportedRequestError(
        f"vLLM's KV cache placement is refused before vLLM allocates it ({runs}{on}): "
        f"{found.message}",
        field="device.kv_cache_layout",
    )


def _backends(
    vllm_config: VllmObject, layers: Mapping[str, LayerSpec], capability: Capability | None
) -> tuple[dict[str, str] | None, str]:
    """Each sparse-MLA kind's backend (None: not known) and where it was read."""
    roles = {name: spec.cache_role for name, spec in layers.items() if isinstance(spec, MLASpec)}
    registered = registered_backends(vllm_config, roles)
    if registered:
        kinds: dict[str, str] = {}
        for name, backend in registered.items():
            kinds.setdefault(ROLE_KINDS[roles[name]], backend)
        return kinds, "as vLLM registered the layer"
    if capability is not None and roles:
        return selected_backends(layers, capability), "as vLLM 0.34 selects it"
    return None, ""
