"""The keyword arguments SGLang 0.5.23's own pool classes take for a plan's pools, so that an
SGLang worker can build exactly the pools the plan describes (`device`,
`enable_memory_saver` and the like are the worker's to add). Values are plain Python: dtypes
by their torch name ("bfloat16", "float8_e4m3fn"), for `getattr(torch, name)`."""

from __future__ import annotations

from typing import Any, Final

from hisparse_plan.adapters.sglang.report import layer_id
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models.any_plan import expect_plan
from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BufferView
from hisparse_plan.models.sglang_plan import SGLangPlan

ROPE_HEAD_DIM: Final = 64
INDEX_HEAD_DIM: Final = 128
FP8_STORED: Final = "uint8"
"""SGLang stores an fp8 cache as bytes: the plan's buffers say uint8, the pool takes fp8."""
MHA_VIEWS: Final = frozenset({"k_buffer", "v_buffer"})
"""Views only an MHA pool has (a latent pool's is kv_buffer)."""
MHA_AXES: Final = "rows, heads, head_dim"
LATENT_AXES: Final = "rows, 1, row"
STATE_AXES: Final = "layers, slots, *"
"""A Mamba state view: its layers, its slots (slot 0 pads) and the state's own axes."""


def _tensor(plan: SGLangPlan, pool: str) -> KVCacheTensor | None:
    return next((t for t in plan.tensors if t.pool == pool), None)


def _required(plan: SGLangPlan, pool: str) -> KVCacheTensor:
    """The tensor of `pool`, which the plan's other pools say it has."""
    tensor = _tensor(plan, pool)
    if tensor is None:
        raise PlanError(f"plan: pool {pool!r} has no tensor; expected one (is the plan checked?)",
                        field="tensors")
    return tensor


def _view(tensor: KVCacheTensor, name: str, axes: str) -> BufferView:
    """The view `name` of a pool's tensor, with the axes SGLang's pool object reads: `axes`
    names them, `*` ending it for "and any more". A view missing, or of another rank, is a
    PlanError saying what was expected and what the plan has."""
    found = next((v for v in tensor.views if v.name == name), None)
    if found is None:
        raise PlanError(
            f"plan: pool {tensor.pool!r} has no view {name!r}; expected one, got views "
            f"{[v.name for v in tensor.views]}", field="tensors",
        )
    wanted = axes.split(", ")
    rank = len(found.shape)
    fits = rank >= len(wanted) if wanted[-1] == "*" else rank == len(wanted)
    if not fits:
        raise PlanError(
            f"plan: view {name!r} of pool {tensor.pool!r} has shape {list(found.shape)}; "
            f"expected the axes [{axes}]", field="tensors",
        )
    return found


def _ids(tensor: KVCacheTensor) -> list[int]:
    return sorted(layer_id(name, i) for i, name in enumerate(tensor.layers))


def _dtype(view: BufferView, fp8: str) -> str:
    return fp8 if view.dtype == FP8_STORED else view.dtype


def _mha(plan: SGLangPlan, pool: str, size: int, fp8: str) -> dict[str, Any]:
    tensor = _required(plan, pool)
    k = _view(tensor, "k_buffer", MHA_AXES)
    separate = _tensor(plan, f"{pool}_v")
    v = _view(tensor if separate is None else separate, "v_buffer", MHA_AXES)
    return {
        "size": size, "page_size": plan.page_size, "dtype": _dtype(k, fp8),
        "head_num": k.shape[1], "head_dim": k.shape[2], "v_head_dim": v.shape[2],
        "layer_num": len(tensor.layers),
    }


def _latent_dims(row: int, packed: bool) -> tuple[int, int]:
    """(kv_lora_rank, qk_rope_head_dim) of a latent row: raw rank + 64, or DSA's packed fp8
    rank + rank / 128 * 4 + 2 * 64 bytes."""
    if packed:
        return (row - 2 * ROPE_HEAD_DIM) * 32 // 33, ROPE_HEAD_DIM
    return row - ROPE_HEAD_DIM, ROPE_HEAD_DIM


def _latent(plan: SGLangPlan, fp8: str) -> tuple[str, dict[str, Any]]:
    tensor = _required(plan, "kv")
    view = _view(tensor, "kv_buffer", LATENT_AXES)
    row = view.shape[2]
    dsa = _tensor(plan, "index") is not None
    packed = dsa and view.dtype == FP8_STORED and (row - 2 * ROPE_HEAD_DIM) * 32 % 33 == 0
    rank, rope = _latent_dims(row, packed)
    kwargs: dict[str, Any] = {
        "size": plan.max_total_num_tokens, "page_size": plan.page_size,
        "kv_lora_rank": rank, "dtype": _dtype(view, fp8), "qk_rope_head_dim": rope,
        "layer_num": len(tensor.layers),
    }
    if not dsa:
        return "MLATokenToKVPool", kwargs
    kwargs.update(index_head_dim=INDEX_HEAD_DIM, kv_cache_dim=row)
    if plan.hisparse is None:
        return "DSATokenToKVPool", kwargs
    kwargs["host_to_device_ratio"] = plan.hisparse.host_to_device_ratio
    return "HiSparseDSATokenToKVPool", kwargs


def pool_kwargs(plan: SGLangPlan, *, fp8: str = "float8_e4m3fn") -> dict[str, dict[str, Any]]:
    """Each SGLang pool object of the plan: `{"class": name, **keyword arguments}`, under the
    plan's pool name (`kv`; `swa` beside it for window models, `mamba` for Mamba hybrids,
    `req_to_token` for the request table). `fp8` names the fp8 format a byte-stored cache
    holds (the plan's buffers keep bytes only).

    The plan is checked first (`check_plan`); a pool or view SGLang's classes need that the
    plan lacks, and the other engine's plan, are PlanErrors saying what was expected."""
    plan = expect_plan(SGLangPlan, plan, "pool_kwargs")
    check_plan(plan)
    names = {pool.name for pool in plan.pools}
    out: dict[str, dict[str, Any]] = {}
    if "v4_swa" in names:
        raise UnsupportedRequestError("plan: DeepSeek-V4 pools have no pool kwargs here")
    if "kv" in names and _tensor(plan, "index") is None and _is_mha(plan):
        full = _mha(plan, "kv", plan.max_total_num_tokens, fp8)
        if "swa" in names:
            swa_tensor = _required(plan, "swa")
            kv_tensor = _required(plan, "kv")
            swa_rows = _view(swa_tensor, "k_buffer", MHA_AXES).shape[0]
            out["kv"] = {
                "class": "SWAKVPool", "size": plan.max_total_num_tokens,
                "size_swa": swa_rows - plan.page_size, "page_size": plan.page_size,
                "dtype": full["dtype"], "head_num": full["head_num"],
                "head_dim": full["head_dim"],
                "swa_attention_layer_ids": _ids(swa_tensor),
                "full_attention_layer_ids": _ids(kv_tensor),
            }
        else:
            out["kv"] = {"class": "MHATokenToKVPool", **full}
    elif "kv" in names:
        cls, kwargs = _latent(plan, fp8)
        out["kv"] = {"class": cls, **kwargs}
    elif "swa" in names and plan.pipeline is not None:
        # A pipeline rank of window layers only: SGLang's window pool with no full layer and
        # no full tokens (its all-window allocator hands out the window pool's).
        window = _mha(plan, "swa", _swa_size(plan), fp8)
        out["kv"] = {
            "class": "SWAKVPool", "size": 0, "size_swa": window["size"],
            "page_size": plan.page_size, "dtype": window["dtype"],
            "head_num": window["head_num"], "head_dim": window["head_dim"],
            "swa_attention_layer_ids": _ids(_required(plan, "swa")),
            "full_attention_layer_ids": [],
        }
    elif "swa" in names:
        out["kv"] = {"class": "MHATokenToKVPool", **_mha(plan, "swa", _swa_size(plan), fp8)}
    pipeline = plan.pipeline
    if pipeline is not None and "kv" in out and out["kv"]["class"] != "SWAKVPool":
        # A pipeline rank's pool holds its own layers, numbered from its first.
        start = pipeline.start_layer
        out["kv"].update(start_layer=start,
                         end_layer=start + pipeline.stage_layers[pipeline.pp_rank])
    conv = _tensor(plan, "mamba_conv0")
    if conv is not None:
        view = _view(conv, "conv[0]", STATE_AXES)
        temporal = _view(_required(plan, "mamba_temporal"), "temporal", STATE_AXES)
        out["mamba"] = {
            "class": "MambaPool", "size": view.shape[1] - 1,
            "conv_state_shape": list(view.shape[2:]), "conv_dtype": view.dtype,
            "temporal_state_shape": list(temporal.shape[2:]), "ssm_dtype": temporal.dtype,
            "mamba_layer_ids": _ids(conv),
        }
    out["req_to_token"] = {
        "class": "ReqToTokenPool", "size": plan.max_running_requests,
        "max_context_len": plan.req_to_token.shape[1],
    }
    return out


def _is_mha(plan: SGLangPlan) -> bool:
    tensor = _tensor(plan, "kv")
    return tensor is not None and any(v.name in MHA_VIEWS for v in tensor.views)


def _swa_size(plan: SGLangPlan) -> int:
    tensor = _required(plan, "swa")
    return _view(tensor, "k_buffer", MHA_AXES).shape[0] - plan.page_size
