"""vLLM's cross-layer KV sharing (`kv_sharing_target_layer_name`) in and out of the contract.

In: vLLM's runner gives a sharing layer no `KVCacheSpec` (`get_kv_cache_spec` skips it), so
`kv_cache_specs` lacks it; vLLM's `get_shared_kv_cache_layers(vllm_config)` reads the pairs off
the attention layers of the static forward context, as `shared_kv_cache_layers` does here. Each
sharing layer enters the request with its target's layer and `kv_sharing_target`.

Out: the plan's groups and tensors hold the allocating layers only, which is vLLM's scheduler
`KVCacheConfig`; vLLM's worker then lists each sharing layer in its target's group and binds it
the target's tensor (`add_kv_sharing_layers_to_kv_cache_groups`, `bind_kv_caches`), which is
what the plan's `kv_sharing` says.
"""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.adapters.vllm.layers import LayerDict
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import UnsupportedRequestError


def shared_kv_cache_layers(vllm_config: VllmObject) -> dict[str, str]:
    """Sharing layer -> target, from the attention layers vLLM registered (empty before the
    model is built, or for a model without sharing)."""
    compilation = getattr(vllm_config, "compilation_config", None)
    context = getattr(compilation, "static_forward_context", None) or {}
    return {
        name: str(target) for name, layer in context.items()
        if (target := getattr(layer, "kv_sharing_target_layer_name", None))
    }


def with_shared_layers(
    layers: Mapping[str, LayerDict], shared: Mapping[str, str]
) -> dict[str, LayerDict]:
    """The request's layers with each sharing layer after them, its target's layer plus
    `kv_sharing_target`."""
    merged = dict(layers)
    for name, target in shared.items():
        found = layers.get(target)
        if found is None or name in layers:
            why = (f"{name!r} has a KVCacheSpec of its own" if name in layers else
                   f"{target!r} has no KVCacheSpec")
            raise UnsupportedRequestError(
                f"kv_sharing_target_layer_name: {name!r} reads {target!r}'s cache, but {why}; "
                "expected the target among kv_cache_specs and the sharing layer not",
                field=f"layers[{name!r}].kv_sharing_target",
            )
        merged[name] = {**found, "kv_sharing_target": target}
    return merged
