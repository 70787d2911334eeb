"""What SGLang 0.5.23 itself computes for one case: budget, sizes and pool buffers.

Run in the SGLang venv (never in the project venv; SGLang is not a dependency):

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \
        references/sglang_reference.py CASE.json [CASE2.json ...]

The SGLang venv (CPU torch; SGLang and triton without their CUDA dependencies)::

    python3 -m venv /work/sglang && cd /work/sglang
    bin/pip install torch==2.13.0 'transformers==5.19.0'
    bin/pip install --no-deps sglang==0.5.23 triton==3.9.0 numpy psutil packaging \
        pydantic requests tqdm regex orjson msgspec pybase64 pillow starlette anyio pyzmq \
        IPython traitlets pygments aiohttp multidict attrs yarl propcache idna aiosignal \
        frozenlist aiohappyeyeballs dill apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 \
        compressed_tensors loguru gguf pytest hypothesis pluggy iniconfig \
        urllib3 charset-normalizer certifi sortedcontainers

``references/sglang_stubs`` on PYTHONPATH stands in for torchvision, which cannot load
beside that torch and which pool sizing never calls.

It prints the reference report as JSON (the shape `hisparse_plan.adapters.sglang.report`
gives for our plans): one object
for one case, a list for several.  A case is JSON::

    {"config": {...HF config.json...} | "tests/hf_configs/NAME/config.json",
     "server_args": {"page_size": 64, "kv_cache_dtype": "fp8_e4m3", "tp_size": 8,
                     "dsa_backend": "flashmla_kv", "context_length": 4096,
                     "hisparse_config": {"top_k": 2048, ...}, ...},
     "memory": {"pre_model_load_free_bytes": N, "post_weights_free_bytes": M}
               | {"available_bytes": N}}

Every number comes from SGLang's own code.  The case drives, in order:
``ServerArgs(...).resolve_once()`` (SGLang's defaults and model overrides:
page size, backends, swa ratio), ``publish`` of the runtime context,
``ModelConfig.from_server_args`` (SGLang's reading of config.json),
``resolve_layer_indices``, ``configure_kv_cache_dtype``, and then
``KVCacheConfigurator.configure`` -- the same call ``ModelRunner.alloc_memory_pool``
makes -- which profiles the budget, sizes the pools (``pool_configurator``),
resolves max_running_requests and builds the real pool, allocator and
req_to_token objects on ``device="meta"``.  The HiSparse host pool is built
from SGLang's ``MLATokenToKVPoolHost`` with the arguments ``HiSparseCoordinator``
passes (the coordinator itself needs CUDA streams).

With speculative decoding (``speculative_algorithm``) the report adds ``draft`` (what SGLang
resolved) and ``draft_pools``: the draft worker's pools, built as ``EAGLEWorkerV2`` builds them,
a second ``KVCacheConfigurator(is_draft_worker=True)`` on the draft model's config read in
draft mode, handed the target's ``memory_pool_config``, ``req_to_token_pool`` and allocator.
An EAGLE/EAGLE3 draft is the case's ``"draft_config"`` (its config.json) or
``speculative_draft_model_path: "@model"`` (the target's own checkpoint); a Mamba hybrid's
intermediate states (``mamba_intermediate_ssm``, ``mamba_intermediate_conv0``: their
allocations) are among the target's pools.

What is patched (the report's ``patched`` list says which ones were used):

* the platform: SGLang's platform queries answer as a CUDA host with one GPU of the case's
  ``gpu.capability`` (SM90, an H200, when none is given), so ``ServerArgs`` resolves through
  its CUDA branches (``sglang_cuda_host.py``, which lists the stand-ins that remain: the
  memory figures below, CUDA 12.8, FlashInfer present, pools on meta).
* ``get_available_gpu_memory`` in ``kv_cache_configurator``: returns the case's
  post-weights free memory (GB = bytes / 2**30, what ``torch.cuda.mem_get_info``
  would give); ``pre_model_load_memory`` is the case's pre-load figure in GB.
  With ``available_bytes`` the pre-load figure is 0 and the post-weights
  figure is the budget, so ``_profile_available_bytes`` returns it unchanged.
* ``torch.get_device_module("meta")`` returns ``torch.cpu`` (pools ask for a
  stream module; nothing is launched).
* the runtime parallel context: tp rank 0, the case's ``dcp_size`` (1 unless given), the
  pipeline rank being sized (one stage unless ``pp_size`` is given), a dummy world group (no
  process group exists on this machine).  DP attention needs no patch:
  ``KVCacheConfigurator`` takes ``attn_dp_size`` from the resolved context, and each case's
  attention TP follows from it.
* with ``pp_size`` > 1, every rank is configured (``_pipeline_reports``): the model namespace
  carries the rank's ``start_layer``/``end_layer`` (``get_pp_indices``, as the model classes'
  ``make_pp_layers`` sets them), and ``torch.distributed.all_reduce`` is a stub process group
  (``_Stage``) answering the ranks' MIN all-reduce of their token capacities with the values
  a first pass recorded.  The report is rank 0's, with every rank's under ``stages``.
* DeepSeek-V4 with HiSparse: the c4 host pool is SGLang's ``DeepSeekV4PagedHostPool`` built
  with the arguments ``HiSparseCoordinator`` passes, on meta (``_v4_hisparse_host``).
* the host-RAM check of SGLang's host pools (``host_memory_budget_bytes``): the
  host pool lives on meta, so this machine's RAM is irrelevant.
* ``model``: a bare namespace -- no weights are loaded, so model-class hooks
  (``get_attention_sliding_window_size``, FP4 scales) are not consulted; the
  sliding window comes from ``ModelConfig``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import math
import os
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any, TypeAlias

import sglang_cuda_host

SGLangObject: TypeAlias = Any
"""An object of SGLang or torch (both untyped in the project venv)."""

REPO = Path(__file__).resolve().parent.parent

# SGLang functions as imported, before any patch (several cases share a process).
_ORIGINALS: dict[str, Any] = {}

# server_args keys of a case that are not ServerArgs fields under that name.
_CASE_ONLY_KEYS = {"dsa_backend", "allow_overwrite_longer_context_len"}
# ...of which these set SGLang's environment instead (true: "1", else unset).
_ENV_KEYS = {"allow_overwrite_longer_context_len": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"}


def _load_config(value: SGLangObject) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    path = Path(str(value))
    if not path.is_absolute():
        path = REPO / path
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _server_args_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Map the case's server_args onto ServerArgs field names."""
    fields = {k: v for k, v in raw.items() if k not in _CASE_ONLY_KEYS and v is not None}
    backend = raw.get("dsa_backend")
    if backend is not None:
        fields.setdefault("dsa_prefill_backend", backend)
        fields.setdefault("dsa_decode_backend", backend)
    if isinstance(fields.get("hisparse_config"), dict):
        fields["hisparse_config"] = json.dumps(fields["hisparse_config"])
    return fields


def _storage_key(tensor: SGLangObject, keys: dict[int, str], pool: str) -> str:
    ident = int(tensor.untyped_storage()._cdata)
    if ident not in keys:
        count = sum(1 for k in keys.values() if k.startswith(pool + "/"))
        keys[ident] = f"{pool}/{count}"
    return keys[ident]


def _buffer(
    name: str, layer: int | None, tensor: SGLangObject, keys: dict[int, str], pool: str
) -> dict[str, Any]:
    return {
        "layer": layer,
        "name": name,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "strides": list(tensor.stride()),
        "storage_offset": int(tensor.storage_offset()),
        "storage_nbytes": int(tensor.untyped_storage().nbytes()),
        "storage": _storage_key(tensor, keys, pool),
    }


class _Collector:
    """Reads buffers off SGLang's pool objects into the report's pool list."""

    def __init__(self) -> None:
        self.pools: dict[str, dict[str, Any]] = {}
        self.keys: dict[int, str] = {}

    def pool(self, name: str, location: str, tokens: int) -> dict[str, Any]:
        entry = self.pools.setdefault(
            name, {"name": name, "location": location, "tokens": int(tokens), "buffers": []}
        )
        return entry

    def add(self, pool: str, name: str, layer: int | None, tensor: SGLangObject) -> None:
        if tensor is None:
            return
        self.pools[pool]["buffers"].append(_buffer(name, layer, tensor, self.keys, pool))

    def per_layer(
        self, pool: str, name: str, tensors: SGLangObject, layer_ids: list[int]
    ) -> None:
        for i, tensor in enumerate(tensors):
            self.add(pool, name, layer_ids[i] if i < len(layer_ids) else None, tensor)

    def report(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(self.pools):
            entry = self.pools[name]
            entry["buffers"].sort(
                key=lambda b: (-1 if b["layer"] is None else b["layer"], b["name"])
            )
            out.append(entry)
        return out


def _layer_range(pool: SGLangObject) -> list[int]:
    start = int(getattr(pool, "start_layer", 0) or 0)
    return list(range(start, start + int(pool.layer_num)))


def _collect_attention(
    col: _Collector, pool: SGLangObject, name: str, layer_ids: list[int]
) -> None:
    """MHA / MLA / DSA pools (one tensor per layer)."""
    col.pool(name, "device", pool.size)
    if hasattr(pool, "k_buffer"):
        col.per_layer(name, "k_buffer", pool.k_buffer, layer_ids)
        col.per_layer(name, "v_buffer", pool.v_buffer, layer_ids)
    if hasattr(pool, "kv_buffer"):
        col.per_layer(name, "kv_buffer", pool.kv_buffer, layer_ids)
    index_cache = getattr(pool, "index_key_cache", None)
    if index_cache is not None:
        col.pool("index", "device", getattr(pool, "index_buf_size", pool.size))
        col.per_layer("index", "index_k", index_cache.buffer, layer_ids)


def _collect_mamba(col: _Collector, mamba_pool: SGLangObject) -> None:
    cache = mamba_pool.mamba_cache
    slots = int(mamba_pool.size)
    for i, conv in enumerate(cache.conv):
        col.pool(f"mamba_conv{i}", "device", slots)
        col.add(f"mamba_conv{i}", f"conv[{i}]", None, conv)
    col.pool("mamba_temporal", "device", slots)
    col.add("mamba_temporal", "temporal", None, cache.temporal)
    # Speculative decoding's SpeculativeState: a state and a conv window a draft token, for
    # the running requests (spec_state_size) and a padding slot.
    ssm = getattr(cache, "intermediate_ssm", None)
    if ssm is not None:
        col.pool("mamba_intermediate_ssm", "device", int(ssm.shape[1]) - 1)
        col.add("mamba_intermediate_ssm", "intermediate_ssm", None, ssm)
    # The conv windows' own allocations: with a draft chain SGLang keeps one shared row of
    # draft tokens + kernel - 2 columns a channel and views it as overlapping windows (an
    # as_strided alias); the allocation is what the pool holds.
    phys = getattr(mamba_pool, "_intermediate_conv_window_phys", None)
    for i, window in enumerate(phys or ()):
        col.pool(f"mamba_intermediate_conv{i}", "device", int(window.shape[1]) - 1)
        col.add(f"mamba_intermediate_conv{i}", f"intermediate_conv_window[{i}]", None, window)


def _collect_dsv4(col: _Collector, pool: SGLangObject, notes: list[str]) -> None:
    """DeepSeek-V4: SWA pool, one compressed pool and indexer pool per ratio, and a
    compress-state pool per compressed layer (its own allocation each)."""
    swa = pool.swa_kv_pool
    col.pool("v4_swa", "device", swa.size)
    # The window pool's buffers are the stage's layers from its first (_swa_local_layer_id:
    # layer_id - _stage_start), which the window pool itself does not record.
    stage_start = int(getattr(pool, "_stage_start", 0) or 0)
    col.per_layer("v4_swa", "kv_buffer", swa.kv_buffer,
                  [stage_start + i for i in _layer_range(swa)])
    by_ratio: dict[int, list[int]] = {}
    for layer, item in enumerate(pool.layer_mapping):
        if item is not None and item.compress_ratio not in (0,):
            by_ratio.setdefault(int(item.compress_ratio), []).append(layer)
    for ratio, sub in sorted(pool.kv_pools.items()):
        if sub is None:
            continue
        pname = f"v4_c{ratio}"
        col.pool(pname, "device", sub.size)
        col.per_layer(pname, "kv_buffer", sub.kv_buffer, by_ratio.get(ratio, []))
    for ratio, sub in sorted(pool.index_pools.items()):
        pname = f"v4_index_c{ratio}"
        col.pool(pname, "device", sub.size)
        col.per_layer(pname, "index_k", sub.index_k_with_scale_buffer, by_ratio.get(ratio, []))
    for prefix, states in (
        ("v4_state_c", pool.compress_state_pools),
        ("v4_index_state_c", pool.indexer_compress_state_pools),
    ):
        for layer, state in enumerate(states):
            if state is None:
                continue
            pname = f"{prefix}{state.ratio}"
            col.pool(pname, "device", state._size)
            tensors = _tensor_attrs(state.kv_score_buffer)
            if not tensors:
                notes.append(f"{pname}: no tensor found on {type(state.kv_score_buffer).__name__}")
            for attr, tensor in tensors:
                col.add(pname, attr, layer, tensor)


def _tensor_attrs(obj: SGLangObject) -> list[tuple[str, SGLangObject]]:
    import torch

    found = []
    names = list(getattr(obj, "__slots__", ())) + list(getattr(obj, "__dict__", {}))
    for attr in names:
        value = getattr(obj, attr, None)
        if isinstance(value, torch.Tensor):
            found.append((attr, value))
    return found


def _collect(col: _Collector, kv: SGLangObject, req_pool: SGLangObject, notes: list[str]) -> None:
    kind = type(kv).__name__
    if kind == "SWAKVPool":
        full_ids = sorted(g for g, (_, swa) in kv.layers_mapping.items() if not swa)
        swa_ids = sorted(g for g, (_, swa) in kv.layers_mapping.items() if swa)
        full_ids.sort(key=lambda g: kv.layers_mapping[g][0])
        swa_ids.sort(key=lambda g: kv.layers_mapping[g][0])
        if getattr(kv, "full_kv_pool", None) is not None and full_ids:
            _collect_attention(col, kv.full_kv_pool, "kv", full_ids)
        _collect_attention(col, kv.swa_kv_pool, "swa", swa_ids)
    elif kind == "HybridLinearKVPool":
        full_ids = list(kv.full_attention_layer_id_mapping)
        full_ids.sort(key=lambda g: kv.full_attention_layer_id_mapping[g])
        _collect_attention(col, kv.full_kv_pool, "kv", full_ids)
    elif kind.startswith("DeepSeekV4"):
        _collect_dsv4(col, kv, notes)
    else:
        _collect_attention(col, kv, "kv", _layer_range(kv))
    mamba = getattr(req_pool, "mamba_pool", None)
    if mamba is not None:
        _collect_mamba(col, mamba)


def _hisparse_host(col: _Collector, kv: SGLangObject, patched: list[str]) -> None:
    """The host pool HiSparseCoordinator builds for a DSA model, on meta."""
    host_mod: SGLangObject = importlib.import_module("sglang.srt.mem_cache.pool_host.mla")
    base_mod: SGLangObject = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    factory: SGLangObject = importlib.import_module("sglang.srt.mem_cache.sparsity")
    ratio = factory.parse_hisparse_config().host_to_device_ratio
    common_mod: SGLangObject = importlib.import_module("sglang.srt.mem_cache.pool_host.common")
    import torch

    base_mod.host_memory_budget_bytes = lambda requested=0, **_: requested
    real_allocate = _ORIGINALS.setdefault("host_allocate", common_mod.HostTensorAllocator.allocate)

    def allocate(
        self: SGLangObject, dims: tuple[int, ...], dtype: SGLangObject, device: str
    ) -> SGLangObject:
        if device != "meta":
            return real_allocate(self, dims, dtype, device)
        self.dtype, self.dims = dtype, dims
        return torch.empty(dims, dtype=dtype, device="meta")

    common_mod.HostTensorAllocator.allocate = allocate
    patched.append(
        "pool_host: host_memory_budget_bytes (no RAM check) and HostTensorAllocator.allocate "
        "(meta tensor of the same dims/dtype instead of an mmap'd CPU tensor)"
    )
    capacity = kv.size if kv.host_capacity_tokens is None else kv.host_capacity_tokens
    host = host_mod.MLATokenToKVPoolHost(
        buffer_info=kv.get_device_pool_infos()[0].buffer_info,
        device_capacity_tokens=capacity,
        start_layer=kv.start_layer,
        end_layer=kv.end_layer,
        target_layer_num=kv.layer_num,
        host_to_device_ratio=ratio,
        host_size=0,
        page_size=kv.page_size,
        layout="layer_first",
        override_kv_cache_dim=kv.kv_cache_dim,
        pin_memory=False,
        device="meta",
    )
    col.pool("hisparse_host", "host", host.size)
    col.add("hisparse_host", "host_kv_buffer", None, host.kv_buffer)


def _hisparse_coordinator_module(patched: list[str]) -> SGLangObject:
    """managers/hisparse_coordinator, imported with a stand-in for schedule_batch (whose import
    chain needs the OpenAI client; the coordinator only names its Req type) and inert CUDA
    streams and events."""
    name = "sglang.srt.managers.schedule_batch"
    real = sys.modules.get(name)
    if real is None:
        stub = types.ModuleType(name)
        stub.Req = object  # type: ignore[attr-defined]
        stub.ScheduleBatch = object  # type: ignore[attr-defined]
        sys.modules[name] = stub
    try:
        module: SGLangObject = importlib.import_module("sglang.srt.managers.hisparse_coordinator")
    finally:
        if real is None:
            sys.modules.pop(name, None)

    class _Inert:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

    module.device_module = types.SimpleNamespace(Stream=_Inert, Event=_Inert,
                                                 current_stream=lambda: None)
    patched.append("hisparse_coordinator: schedule_batch stand-in (Req), inert streams/events")
    return module


class _CoordinatorRefused(Exception):
    """HiSparseCoordinator refused at startup, after SGLang built the pools."""


def _coordinator_draft_tokens() -> int:
    """The draft tokens ModelRunner.maybe_init_hisparse_coordinator hands the coordinator: 0
    without a speculative algorithm, else the resolved speculative_num_draft_tokens."""
    spec = importlib.import_module("sglang.srt.runtime_context").get_spec()
    algorithm = importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm
    if algorithm.from_string(spec.speculative_algorithm).is_none():
        return 0
    return int(spec.speculative_num_draft_tokens or 0)


def _hisparse_metadata(
    result: SGLangObject, model_config: SGLangObject, patched: list[str]
) -> list[dict[str, Any]] | None:
    """Every tensor HiSparse allocates beside the KV budget, from SGLang's own objects: the
    HiSparseCoordinator built as ModelRunner.maybe_init_hisparse_coordinator builds it (on
    meta; its host pool's pinned buffer on meta too), its host pool's slot tables, and the
    HiSparse allocator's tables. A DSA pool only (DeepSeek-V4's coordinator is another path).
    The coordinator gets the draft tokens ModelRunner hands it, so with speculative decoding
    its speculative swap's tables are listed (owner ``spec_swap``), and its startup checks
    raise _CoordinatorRefused (the report's ``unusable``)."""
    import torch

    allocator = result.token_to_kv_pool_allocator
    if type(result.token_to_kv_pool).__name__ != "HiSparseDSATokenToKVPool":
        return None
    module = _hisparse_coordinator_module(patched)
    factory: SGLangObject = importlib.import_module("sglang.srt.mem_cache.sparsity")
    common_mod: SGLangObject = importlib.import_module("sglang.srt.mem_cache.pool_host.common")
    real_allocate = _ORIGINALS.setdefault("host_allocate", common_mod.HostTensorAllocator.allocate)
    real_register = _ORIGINALS.setdefault("host_register", common_mod._cuda_host_register)

    def allocate(self: SGLangObject, dims: tuple[int, ...], dtype: SGLangObject,
                 device: str) -> SGLangObject:
        self.dtype, self.dims = dtype, dims
        return torch.empty(dims, dtype=dtype, device="meta")

    cfg = factory.parse_hisparse_config()
    text = model_config.hf_text_config
    common_mod.HostTensorAllocator.allocate = allocate
    common_mod._cuda_host_register = lambda *a, **k: None
    real_world = torch.distributed.get_world_size
    torch.distributed.get_world_size = lambda group=None: 1
    try:
        coordinator = module.HiSparseCoordinator(
            req_to_token_pool=result.req_to_token_pool, token_to_kv_pool_allocator=allocator,
            top_k=getattr(text, "index_topk", cfg.top_k),
            device_buffer_size=cfg.device_buffer_size, device="meta", tp_group=None,
            host_to_device_ratio=cfg.host_to_device_ratio,
            swap_in_block_size=cfg.swap_in_block_size,
            shared_index_layers=module.resolve_shared_index_layers(hf_text_config=text),
            num_draft_tokens=_coordinator_draft_tokens(),
        )
    except ValueError as exc:  # its speculative swap's startup checks, after the pools
        raise _CoordinatorRefused(str(exc)) from exc
    finally:
        common_mod.HostTensorAllocator.allocate = real_allocate
        common_mod._cuda_host_register = real_register
        torch.distributed.get_world_size = real_world
    patched.append("HiSparseCoordinator on meta (its host pool's buffer on meta, no pinning, "
                   "world size 1) for its metadata tensors")
    host = coordinator.mem_pool_host
    spec_swap = (("spec_swap", coordinator.spec_swap, None),) if coordinator.spec_swap.enabled \
        else ()  # without drafts its only table is [layers, slots, 0]
    owners = (
        ("coordinator", coordinator, None),
        *spec_swap,
        ("host_pool", host, ("mem_state", "free_slots", "slot_used", "data_ptrs")),
        ("allocator", allocator, ("full_to_hisparse_device_index_mapping",)),
        ("allocator.logical", allocator.logical_attn_allocator, ("free_pages",)),
        ("allocator.hisparse", allocator.hisparse_attn_allocator, ("free_pages",)),
    )
    found = []
    for owner, obj, names in owners:
        for attr, tensor in sorted(vars(obj).items()):
            if not isinstance(tensor, torch.Tensor) or (names is not None and attr not in names):
                continue
            found.append({
                "owner": owner, "name": attr,
                "location": "host" if tensor.device.type == "cpu" else "device",
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape),
                "nbytes": int(tensor.numel() * tensor.element_size()),
            })
    return sorted(found, key=lambda b: (b["owner"], b["name"]))


def _hisparse_decode_probe(model_config: SGLangObject, patched: list[str]) -> str | None:
    """What SGLang's decode swap-in says of the top-k and hot buffer the coordinator runs
    (model_runner: index_topk, else the config's top_k; the config's device_buffer_size):
    its kernel wrapper asserts hot_buffer_size >= num_top_k before building the kernel. The
    wrapper runs up to that build (stopped there); an AssertionError means the server's
    first decode step fails."""
    kernels: SGLangObject = importlib.import_module("sglang.kernels.ops.kvcache.hisparse")
    factory: SGLangObject = importlib.import_module("sglang.srt.mem_cache.sparsity")
    cfg = factory.parse_hisparse_config()
    top_k = getattr(model_config.hf_text_config, "index_topk", cfg.top_k)

    class _Built(Exception):
        pass

    def build(*args: object, **kwargs: object) -> None:
        raise _Built

    real_build = _ORIGINALS.setdefault("jit_sparse", kernels._jit_sparse_module)
    kernels._jit_sparse_module = build
    try:
        kernels._load_cache_to_device_buffer_mla(
            is_dsv4_layout=False, top_k_tokens=None, device_buffer_tokens=None,
            host_cache_locs=None, device_buffer_locs=None, host_cache=None,
            device_buffer=None, top_k_device_locs=None, req_pool_indices=None, seq_lens=None,
            lru_slots=None, item_size_bytes=0, num_top_k=top_k,
            hot_buffer_size=cfg.device_buffer_size, page_size=1,
            block_size=cfg.swap_in_block_size, num_real_reqs=None, miss_src=None,
            miss_dst=None, miss_count=None, skip_io=False,
        )
    except AssertionError as error:
        return f"decode swap-in: AssertionError: {error}"
    except _Built:
        return None
    finally:
        kernels._jit_sparse_module = real_build
        patched.append("hisparse decode probe: the swap-in wrapper run up to its kernel build")
    return None


def _dsa_model_build_probe(model_config: SGLangObject) -> str | None:
    """What SGLang's DSA model class says of the config's index sharing: each
    DeepseekV2AttentionMLA asks dsa_layer_skips_topk of its layer and the next
    (models/deepseek_v2.py), which asserts on a pattern whose layer 0 would share (an
    index_skip_topk_offset of 0): the model cannot be built, though the pools can; where it
    builds with layer 0 sharing (GLM's indexer_types), its first decode has no top-k."""
    mc: SGLangObject = importlib.import_module("sglang.srt.configs.model_config")
    config = model_config.hf_config
    if not mc.is_deepseek_dsa(config):
        return None
    try:
        for layer in range(int(model_config.hf_text_config.num_hidden_layers) + 1):
            mc.dsa_layer_skips_topk(config, layer)
    except AssertionError as error:
        return f"model build: dsa_layer_skips_topk: AssertionError: {error}"
    if mc.dsa_layer_skips_topk(config, 0):
        # Layer 0 shares (a GLM config's indexer_types from an offset of 0): it runs no
        # indexer (should_run_indexer), no earlier layer hands it a top-k, so its sparse
        # decode gets topk_indices None (transform_index_page_table_decode reads its shape).
        return ("model decode: dsa_layer_skips_topk(config, 0) is True: layer 0 reuses a "
                "top-k no earlier layer computed")
    return None


def _qwen3_next_layers_probe(model_config: SGLangObject) -> str | None:
    """What SGLang's Qwen3-Next model class builds against the checkpoint's layer_types:
    models/qwen3_next.py makes each decoder layer by its config's `layers_block_type`
    (configs/qwen3_next.py: every full_attention_interval-th layer attention), and the pools
    follow the same interval (ModelConfig.full_attention_interval); a config.json whose
    layer_types lists other layers is served as another model than the checkpoint's (its
    weights do not fit the layers built)."""
    config = model_config.hf_text_config
    archs = list(getattr(model_config.hf_config, "architectures", None) or [])
    # SGLang's Qwen3NextConfig takes layer_types and keeps none: read the checkpoint's file.
    raw = json.loads((Path(model_config.model_path) / "config.json").read_text())
    types = raw.get("layer_types")
    if archs[:1] != ["Qwen3NextForCausalLM"] or not types:
        return None
    every = int(getattr(config, "full_attention_interval", 4) or 4)
    built = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
             for i in range(int(config.num_hidden_layers))]
    if list(types) == built:
        return None
    first = next(i for i, (a, b) in enumerate(zip(types, built, strict=False)) if a != b)
    return (f"model layers: Qwen3-Next builds layer {first} as {built[first]} "
            f"(full_attention_interval {every}), the checkpoint's layer_types say {types[first]}")


def _v4_hisparse_host(col: _Collector, allocator: SGLangObject, patched: list[str]) -> None:
    """The c4 host pool HiSparseCoordinator builds for DeepSeek-V4 (``is_dsv4_hisparse``),
    with the coordinator's own arguments, on meta: a DeepSeekV4PagedHostPool mirroring the
    HiSparse c4 device pool, one page-row buffer a c4 layer."""
    import torch

    host_mod: SGLangObject = importlib.import_module("sglang.srt.mem_cache.memory_pool_host")
    host_mod.host_memory_budget_bytes = lambda requested=0, **_: 1 << 62
    host_mod.ALLOC_MEMORY_FUNCS["meta"] = lambda dims, dtype, device, **_: torch.empty(
        dims, dtype=dtype, device="meta")
    patched.append("memory_pool_host: host_memory_budget_bytes (no RAM check) and the "
                   "meta device's allocator (meta tensors of the same dims/dtype)")
    device = allocator.hisparse_kvcache
    page = device.page_size
    num_host_pages = (allocator.size_full // allocator.compress_ratio + page - 1) // page
    host = host_mod.DeepSeekV4PagedHostPool(
        pool_name="dsv4_hisparse_c4",
        device_buffers=device.kv_buffer,
        item_bytes=device.bytes_per_page_padded,
        num_host_pages=num_host_pages,
        slot_page_size=page,
        layout="layer_first",
        device="meta",
        pin_memory=False,
    )
    kv = allocator._kvcache
    c4_layers = [layer for layer, item in enumerate(kv.layer_mapping)
                 if item is not None and item.compress_ratio == 4]
    col.pool("v4_hisparse_host", "host", host.size)
    col.per_layer("v4_hisparse_host", "kv_buffer", host.kv_buffer, c4_layers)


def _cuda_only_registrations(patched: list[str]) -> None:
    """Registrations SGLang makes only when it sees a CUDA platform."""
    quant: SGLangObject = importlib.import_module("sglang.srt.layers.quantization")
    if "mxfp4" not in quant.QUANTIZATION_METHODS:
        quant.QUANTIZATION_METHODS["mxfp4"] = quant.Mxfp4Config
        quant.BASE_QUANTIZATION_METHODS["mxfp4"] = quant.Mxfp4Config
        patched.append("quantization: mxfp4 -> Mxfp4Config (registered on CUDA only)")
    mamba_hook: SGLangObject = importlib.import_module("sglang.srt.arg_groups.mamba_hook")
    mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True
    patched.append("mamba_hook: platform supports mamba extra_buffer (true on CUDA)")


def _gpu_memory(gpu: dict[str, Any], patched: list[str], torch: SGLangObject) -> None:
    """A case's `"gpu": {"total_memory_bytes": N, "name": ...}`: SGLang's own GPU-memory query
    answers N as nvidia-smi would (whole MiB), so ServerArgs' default mem_fraction_static,
    chunked_prefill_size and decode graph batch run their real rule; the prefill CUDA graph
    backend defaults to what SGLang picks on a CUDA machine (breakable), since that rule's
    graph reserve depends on it.  Without the key SGLang sees no GPU memory (its 0.95
    fallback) and the CPU default (no prefill graph), as before."""
    memory_hook: SGLangObject = importlib.import_module("sglang.srt.arg_groups.memory_hook")
    kv_shard_hook: SGLangObject = importlib.import_module("sglang.srt.arg_groups.kv_shard_hook")
    graph_config: SGLangObject = importlib.import_module(
        "sglang.srt.model_executor.cuda_graph_config"
    )
    real_query = _ORIGINALS.setdefault("capacity", memory_hook.get_device_memory_capacity)
    real_backend = _ORIGINALS.setdefault("prefill_backend", graph_config.default_prefill_backend)
    real_name = _ORIGINALS.setdefault("device_name", torch.cuda.get_device_name)
    total = gpu.get("total_memory_bytes")
    if total is None:
        memory_hook.get_device_memory_capacity = real_query
        kv_shard_hook.get_device_memory_capacity = real_query
        graph_config.default_prefill_backend = real_backend
        torch.cuda.get_device_name = real_name
        return
    mib = float(int(total) // (1 << 20))

    def capacity(device: str | None = None) -> float:
        return mib

    memory_hook.get_device_memory_capacity = capacity
    kv_shard_hook.get_device_memory_capacity = capacity
    graph_config.default_prefill_backend = lambda: graph_config.Backend.BREAKABLE
    name = str(gpu.get("name", "NVIDIA GPU"))
    torch.cuda.get_device_name = lambda device=None: name
    patched.append(
        f"get_device_memory_capacity -> {mib} MiB (nvidia-smi memory.total of {name}: "
        f"{int(total)} bytes, floored to MiB); default_prefill_backend -> breakable (CUDA)"
    )


def _write_model_dir(config: dict[str, Any], tmp: Path) -> Path:
    model_dir = tmp / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


def _resolve(case: dict[str, Any], model_dir: Path, patched: list[str]) -> SGLangObject:
    """ServerArgs for the case, resolved by SGLang (defaults and model overrides) and
    published as the runtime context."""
    import torch

    server_args_mod: SGLangObject = importlib.import_module("sglang.srt.server_args")
    rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
    raw = dict(case.get("server_args", {}))
    for key, var in _ENV_KEYS.items():
        if raw.get(key):
            os.environ[var] = "1"
            patched.append(f"environment: {var}=1")
        else:
            os.environ.pop(var, None)
    fields = _server_args_fields(raw)
    fields.setdefault("device", "cuda")
    fields.setdefault("load_format", "dummy")
    fields.setdefault("skip_tokenizer_init", True)
    _draft_model_path(case, fields, model_dir)
    _cuda_only_registrations(patched)
    capability = case.get("gpu", {}).get("capability")
    patched.append(sglang_cuda_host.install(None if capability is None else tuple(capability),
                                            torch))
    _gpu_memory(case.get("gpu", {}), patched, torch)
    server_args = server_args_mod.ServerArgs(model_path=str(model_dir), **fields)
    server_args.resolve_once()
    rc.publish(server_args, role="test")
    return server_args


def _draft_model_path(case: dict[str, Any], fields: dict[str, Any], model_dir: Path) -> None:
    """A case's draft model for EAGLE / EAGLE3: `"draft_config": {...}` (the draft's
    config.json, written beside the target's) or `speculative_draft_model_path: "@model"` (the
    target's own checkpoint, as Qwen3-Next's MTP head is served)."""
    draft = case.get("draft_config")
    if draft is not None:
        draft_dir = model_dir.parent / "draft"
        draft_dir.mkdir(exist_ok=True)
        (draft_dir / "config.json").write_text(json.dumps(_load_config(draft)))
        fields["speculative_draft_model_path"] = str(draft_dir)
    elif fields.get("speculative_draft_model_path") == "@model":
        fields["speculative_draft_model_path"] = str(model_dir)


def _check_registry(model_config: SGLangObject, patched: list[str]) -> None:
    """SGLang's model loader refuses an architecture its ModelRegistry lacks
    (``_raise_for_unsupported``); the registry itself cannot be imported here (its model
    modules need CUDA-only packages), so its names are read from the modules' source
    (sglang_archs.py), as ``import_model_classes`` collects them."""
    import sglang_archs

    models_dir = Path(importlib.import_module("sglang.srt.models").__path__[0])
    served = _ORIGINALS.setdefault("served", sglang_archs.served_architectures(models_dir))
    archs = list(model_config.hf_config.architectures or [])
    if not any(arch in served for arch in archs):
        raise ValueError(f"Model architectures {archs} are not supported for now.")
    patched.append("model registry: architectures checked against sglang/srt/models' "
                   "EntryClass names (sglang_archs.py)")


def memory_defaults(case: dict[str, Any]) -> dict[str, Any]:
    """Only what SGLang's memory rule resolves for the case (mem_fraction_static, chunked
    prefill size, graph settings), without building pools: a quick check of the rule."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
    with tempfile.TemporaryDirectory() as tmp_name:
        model_dir = _write_model_dir(_load_config(case["config"]), Path(tmp_name))
        server_args = _resolve(case, model_dir, [])
        return {
            "mem_fraction_static": rc.get_schedule().mem_fraction_static,
            **_graph_settings(server_args),
        }


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Reference report of one case (raises what SGLang raises); a case with ``pp_size`` > 1
    is every pipeline rank's (``_pipeline_reports``)."""
    pp = int(case.get("server_args", {}).get("pp_size") or 1)
    if pp > 1:
        return _pipeline_reports(case, pp)
    return _run_rank(case, None)


class _Stage:
    """One pipeline rank as SGLang's runtime sees it: its rank, the pp group (a stub: no
    process group exists here), and the token counts the other ranks hand the MIN all-reduce
    of ``KVCacheConfigurator._apply_token_constraints`` (None: record this rank's own)."""

    def __init__(self, rank: int, size: int, peers: list[list[int]] | None) -> None:
        self.rank, self.size, self.peers = rank, size, peers
        self.sent: list[int] = []
        self.group = types.SimpleNamespace(
            rank_in_group=rank, world_size=size, is_first_rank=rank == 0,
            is_last_rank=rank == size - 1, cpu_group=None,
        )

    def all_reduce(self, tensor: SGLangObject, *_: SGLangObject, **__: SGLangObject) -> None:
        """MIN over the ranks: the value this rank sends is recorded; with the peers' values
        of the same call known, the tensor becomes their minimum."""
        call = len(self.sent)
        self.sent.append(int(tensor.item()))
        if self.peers is not None:
            tensor.fill_(min(peer[call] for peer in self.peers))


def _pipeline_reports(case: dict[str, Any], pp: int) -> dict[str, Any]:
    """Every pipeline rank's report, SGLang's own code sizing each (its layers
    [start_layer, end_layer) from ``get_pp_indices``, set on the model as its class does).
    The ranks meet once, in the MIN all-reduce of their token capacities: a first pass
    records what each rank sends, a second replays each rank with the others' values (the
    process-group stub, ``_Stage``). The top level is rank 0's report (the draft worker's
    pools the last rank's, where SGLang's EAGLEWorkerV2 runs), ``stages`` all."""
    first = [_Stage(rank, pp, None) for rank in range(pp)]
    for stage in first:
        try:
            _run_rank(case, stage)
        except Exception:
            # Past its all-reduce a rank of the first pass builds its pools for its own
            # capacity, not the ranks' minimum it gets in SGLang (a Mamba-only rank offers
            # int64's maximum): what it sent is all this pass is for; the second pass runs it
            # with the minimum, and fails there if SGLang does.
            if not stage.sent:
                raise
    sent = [stage.sent for stage in first]
    reports = [_run_rank(case, _Stage(rank, pp, sent)) for rank in range(pp)]
    top = {k: v for k, v in reports[0].items() if k not in ("pools", "notes", "patched")}
    for key in ("draft", "draft_pools"):  # only the last rank runs the draft worker
        if key in reports[-1]:
            top[key] = reports[-1][key]
    failing = [report["unusable"] for report in reports if "unusable" in report]
    if failing:
        top["unusable"] = failing[0]
    return {**top, "stages": [{k: v for k, v in report.items() if k in _STAGE_KEYS}
                              for report in reports],
            "notes": reports[0]["notes"], "patched": reports[0]["patched"]}


_STAGE_KEYS = ("max_total_num_tokens", "max_running_requests", "cell_size_bytes",
               "available_bytes", "req_to_token", "pools", "layers")


def _run_rank(case: dict[str, Any], stage: _Stage | None) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch

    notes: list[str] = []
    patched: list[str] = []
    config = _load_config(case["config"])
    raw_args = dict(case.get("server_args", {}))
    memory = dict(case.get("memory", {}))
    with tempfile.TemporaryDirectory() as tmp_name:
        model_dir = _write_model_dir(config, Path(tmp_name))
        rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
        server_args = _resolve(case, model_dir, patched)
        tp = int(rc.get_parallel().attn_tp_size)
        # The case's own dcp_size (the context's value outlives a case: overrides are
        # permanent in this process).
        dcp = int(server_args.resolved_dict().get("dcp_size") or 1)
        rc.get_parallel().override_permanently(
            attn_dcp_size=dcp,
            tp_rank=0,
            attn_tp_rank=0,
            world_group=types.SimpleNamespace(cpu_group=None),
            launch_world_size=int(server_args.tp_size),
            pp_size=1 if stage is None else stage.size,
            pp_rank=0 if stage is None else stage.rank,
            pp_group=None if stage is None else stage.group,
        )
        patched.append(f"runtime parallel context: rank 0, attn_dcp_size {dcp} (the case's "
                       f"dcp_size), pp rank {0 if stage is None else stage.rank} of "
                       f"{1 if stage is None else stage.size}, dummy world group")
        if stage is not None:
            torch.distributed.all_reduce = stage.all_reduce
            patched.append("torch.distributed.all_reduce -> the pp MIN over the ranks' values "
                           "(process-group stub)")
        mc_mod: SGLangObject = importlib.import_module("sglang.srt.configs.model_config")
        model_config = mc_mod.ModelConfig.from_server_args(server_args)
        _check_registry(model_config, patched)
        given = set(raw_args)
        if "total_memory_bytes" in case.get("gpu", {}):
            given.add("gpu")
        return _configure(model_config, server_args, memory, tp, notes, patched, torch, given,
                          stage=stage)


def _configure(
    model_config: SGLangObject,
    server_args: SGLangObject,
    memory: dict[str, Any],
    tp: int,
    notes: list[str],
    patched: list[str],
    torch: SGLangObject,
    _given: set[str],
    *,
    stage: _Stage | None = None,
) -> dict[str, Any]:
    rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
    kcc: SGLangObject = importlib.import_module("sglang.srt.mem_cache.kv_cache_configurator")
    pc: SGLangObject = importlib.import_module("sglang.srt.model_executor.pool_configurator")
    aux_mod: SGLangObject = importlib.import_module(
        "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state"
    )
    spec_mod: SGLangObject = importlib.import_module("sglang.srt.speculative.spec_info")

    # Memory figures, in the GB floats SGLang's memory queries return.
    gib = float(1 << 30)
    if "available_bytes" in memory:
        pre_gb = 0.0
        post_gb = int(memory["available_bytes"]) / gib
    else:
        pre_gb = int(memory["pre_model_load_free_bytes"]) / gib
        post_gb = int(memory["post_weights_free_bytes"]) / gib
    kcc.get_available_gpu_memory = lambda *a, **k: post_gb
    if rc.get_spec().speculative_algorithm is not None:
        pool_mod: SGLangObject = importlib.import_module("sglang.srt.mem_cache.memory_pool")
        pool_mod.MHATokenToKVPool._init_kv_copy_and_warmup = lambda self: None
        patched.append("MHATokenToKVPool._init_kv_copy_and_warmup -> no-op (speculative "
                       "decoding's KV-move kernel tiling and its warmup launch: no buffer)")
    patched.append("kv_cache_configurator.get_available_gpu_memory -> case post-weights figure")
    real_module = _ORIGINALS.setdefault("get_device_module", torch.get_device_module)
    torch.get_device_module = lambda d=None: (
        torch.cpu if str(d) == "meta" else real_module(d)
    )
    patched.append('torch.get_device_module("meta") -> torch.cpu')

    # Record the configurator SGLang picks, its cell size and the budget it gets.
    seen: dict[str, Any] = {}
    real_create = _ORIGINALS.setdefault("create", pc.create_memory_pool_configurator)

    def create(kvc: SGLangObject) -> SGLangObject:
        conf = real_create(kvc)
        seen.setdefault("configurator", conf)
        real_calc = conf.calculate_pool_sizes

        def calc(available_bytes: int, page_size: int) -> SGLangObject:
            seen.setdefault("available_bytes", int(available_bytes))
            return real_calc(available_bytes, page_size)

        conf.calculate_pool_sizes = calc
        return conf

    pc.create_memory_pool_configurator = create

    model = _stage_model(model_config, stage, patched)
    spec = rc.get_spec()
    kvc = _kv_configurator(
        server_args, model, model_config,
        _spec_aux_config(aux_mod, spec_mod, server_args, model_config, spec, notes),
        is_draft_worker=False, stage=stage,
    )
    if "mem_fraction_static" not in _given and "gpu" in _given:
        notes.append(
            "mem_fraction_static not given: SGLang's default rule ran on the case's GPU memory "
            f"and resolved to {rc.get_schedule().mem_fraction_static}"
        )
    elif server_args.mem_fraction_static is not None and "mem_fraction_static" not in _given:
        notes.append(
            "mem_fraction_static not given: SGLang's default rule needs the GPU's total memory, "
            f"unknown on this machine, so it resolved to {server_args.mem_fraction_static}"
        )
    notes.append(
        "post_capture_kv_active=False (the runner's is_post_capture_kv_active needs the "
        "live allocator); model hooks absent (no weights loaded)"
    )
    result = kvc.configure(pre_model_load_memory=pre_gb)

    col = _Collector()
    _collect(col, result.token_to_kv_pool, result.req_to_token_pool, notes)
    draft = _draft_report(server_args, result, kvc, notes, patched)
    schedule = rc.get_schedule()
    metadata: list[dict[str, Any]] | None = None
    # SGLang builds the model before its pools, and the HiSparse coordinator after them.
    unusable = _dsa_model_build_probe(model_config) or _qwen3_next_layers_probe(model_config)
    if rc.get_memory().enable_hisparse and type(result.token_to_kv_pool).__name__.startswith(
            "DeepSeekV4"):
        _v4_hisparse_host(col, result.token_to_kv_pool_allocator, patched)
    elif rc.get_memory().enable_hisparse:
        _hisparse_host(col, result.token_to_kv_pool, patched)
        if unusable is None:
            try:
                metadata = _hisparse_metadata(result, model_config, patched)
            except _CoordinatorRefused as exc:
                unusable = f"coordinator startup: {exc}"
            else:
                unusable = _hisparse_decode_probe(model_config, patched)
    conf = seen.get("configurator")
    cell = getattr(conf, "_cell_size", None)
    req = result.req_to_token_pool.req_to_token
    report: dict[str, Any] = {
        "page_size": int(schedule.page_size),
        "max_total_num_tokens": int(result.max_total_num_tokens),
        "max_running_requests": int(result.max_running_requests),
        "cell_size_bytes": None if cell is None else _num(cell),
        "available_bytes": seen.get("available_bytes"),
        "req_to_token": {"shape": list(req.shape), "dtype": str(req.dtype).removeprefix("torch.")},
        "pools": col.report(),
        **draft,
        "sglang": {
            "configurator": type(conf).__name__,
            "token_to_kv_pool": type(result.token_to_kv_pool).__name__,
            "allocator": type(result.token_to_kv_pool_allocator).__name__,
            "req_to_token_pool": type(result.req_to_token_pool).__name__,
            "kv_cache_dtype": str(kvc.kv_cache_dtype).removeprefix("torch."),
            "mem_fraction_static": schedule.mem_fraction_static,
            "context_len": int(model_config.context_len),
            "tp_size": tp,
            "full_max_total_num_tokens": result.full_max_total_num_tokens,
            "swa_max_total_num_tokens": result.swa_max_total_num_tokens,
            "swa_full_tokens_ratio": schedule.swa_full_tokens_ratio,
            "max_mamba_cache_size": schedule.max_mamba_cache_size,
            "dsa_prefill_backend": rc.get_exec().kernel.dsa_prefill_backend,
            "dsa_decode_backend": rc.get_exec().kernel.dsa_decode_backend,
            "attention_backend": server_args.resolved_dict().get("attention_backend"),
            "mamba_scheduler_strategy": server_args.resolved_dict().get("mamba_scheduler_strategy"),
            **_graph_settings(server_args),
        },
        "notes": notes,
        "patched": patched,
    }
    if metadata is not None:
        report["hisparse_metadata"] = metadata
    draft_unusable = report.pop("draft_unusable", None)
    if unusable is None and (stage is None or stage.group.is_last_rank):
        unusable = draft_unusable  # only the last rank runs the draft worker
    if unusable is not None:
        report["unusable"] = unusable
    if stage is not None:
        report["layers"] = [int(model.start_layer), int(model.end_layer)]
    return report


def _stage_model(
    model_config: SGLangObject, stage: _Stage | None, patched: list[str]
) -> SGLangObject:
    """The bare model namespace; on a pipeline rank with the [start_layer, end_layer) its
    class sets (``make_pp_layers``: ``get_pp_indices`` of the config's num_hidden_layers)."""
    if stage is None:
        return types.SimpleNamespace()
    utils: SGLangObject = importlib.import_module("sglang.srt.distributed.utils")
    start, end = utils.get_pp_indices(model_config.num_hidden_layers, stage.rank, stage.size)
    patched.append(f"model: start_layer {start}, end_layer {end} (get_pp_indices, rank "
                   f"{stage.rank} of {stage.size})")
    return types.SimpleNamespace(start_layer=start, end_layer=end)


def _kv_configurator(
    server_args: SGLangObject, model: SGLangObject, model_config: SGLangObject,
    spec_aux_config: SGLangObject, *, is_draft_worker: bool, stage: _Stage | None = None,
    target: SGLangObject = None,
) -> SGLangObject:
    """SGLang's KVCacheConfigurator as a ModelRunner builds it, on meta: the target's (on a
    pipeline rank, with the stage's group), or the draft worker's, given the target's
    memory_pool_config, req_to_token_pool and allocator (`target`, its configure result)."""
    rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
    kcc: SGLangObject = importlib.import_module("sglang.srt.mem_cache.kv_cache_configurator")
    layer_setup: SGLangObject = importlib.import_module(
        "sglang.srt.model_executor.model_runner_components.layer_setup"
    )
    load_utils: SGLangObject = importlib.import_module(
        "sglang.srt.model_executor.model_runner_components.load_model_utils"
    )
    spec_mod: SGLangObject = importlib.import_module("sglang.srt.speculative.spec_info")
    kvd: SGLangObject = importlib.import_module("sglang.srt.mem_cache.kv_cache_dtype")
    mc_mod: SGLangObject = importlib.import_module("sglang.srt.configs.model_config")
    spec = rc.get_spec()
    layer_info = layer_setup.resolve_layer_indices(
        model=model, model_config=model_config, is_draft_worker=is_draft_worker
    )
    resolved_dtype, kv_dtype = kvd.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=rc.get_model().kv_cache_dtype,
        model=None,
        model_dtype=model_config.dtype,
        is_draft_worker=is_draft_worker,
        is_dflash=False,
        speculative_draft_attention_backend=(
            spec.speculative_draft_attention_backend if is_draft_worker else None),
        speculative_draft_kv_cache_dtype=spec.speculative_draft_kv_cache_dtype,
    )
    return kcc.KVCacheConfigurator(
        device="meta",
        gpu_id=0,
        attn_dp_size=rc.get_parallel().attn_dp_size,
        pp_size=1 if stage is None else stage.size,
        pp_group=None if stage is None else stage.group,
        model=model,
        model_config=model_config,
        server_args=server_args,
        kv_cache_dtype=kv_dtype,
        kv_cache_dtype_str=resolved_dtype or rc.get_model().kv_cache_dtype,
        model_dtype=model_config.dtype,
        page_size=rc.get_schedule().page_size,
        sliding_window_size=load_utils.resolve_sliding_window_size(model, model_config),
        spec_algorithm=spec_mod.SpeculativeAlgorithm.from_string(spec.speculative_algorithm),
        is_draft_worker=is_draft_worker,
        post_capture_kv_active=False,
        spec_aux_config=spec_aux_config,
        is_hybrid_swa=model_config.is_hybrid_swa,
        is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
        use_mla_backend=model_config.attention_arch == mc_mod.AttentionArch.MLA,
        layer_info=layer_info,
        forward_stream=None,
        req_to_token_pool=None if target is None else target.req_to_token_pool,
        token_to_kv_pool_allocator=None if target is None else target.token_to_kv_pool_allocator,
        memory_pool_config=None if target is None else target.memory_pool_config,
    )


def _spec_aux_config(
    aux_mod: SGLangObject, spec_mod: SGLangObject, server_args: SGLangObject,
    model_config: SGLangObject, spec: SGLangObject, notes: list[str],
) -> SGLangObject:
    """The target's speculative-decoding config as ModelRunner resolves it (the draft's layer
    count, which joins the target's cell size); a plain default without a speculative
    algorithm.  The draft worker's own pools are built apart (``_draft_report``)."""
    algorithm = spec_mod.SpeculativeAlgorithm.from_string(spec.speculative_algorithm)
    if algorithm.is_none():
        return aux_mod.SpecAuxHiddenStateConfig()
    notes.append(
        "speculative decoding: the target's pools and budget (the draft's layers in its cell "
        "size); the draft worker's pools (draft_pools) built by its own configurator on the "
        "target's allocator and memory_pool_config (a hybrid-window draft's SWAKVPool too)"
    )
    return aux_mod.resolve_spec_aux_hidden_state_config(
        server_args=server_args, model_config=model_config, spec_algorithm=algorithm,
        is_draft_worker=False,
    )


def _draft_report(
    server_args: SGLangObject, target: SGLangObject, target_kvc: SGLangObject,
    notes: list[str], patched: list[str],
) -> dict[str, Any]:
    """With speculative decoding, the draft worker's pools as its ModelRunner builds them
    (``EAGLEWorkerV2.alloc_memory_pool`` -> ``ModelRunner.alloc_memory_pool``): the draft
    model's config read in draft mode (``ModelConfig.from_server_args(..., is_draft_model=True)``
    on the resolved ``speculative_draft_model_path``: the target's own checkpoint for a
    DeepSeek-style MTP head), its layer range (``resolve_layer_indices(is_draft_worker=True)``),
    its kv dtype, and a ``KVCacheConfigurator(is_draft_worker=True)`` given the target's
    ``memory_pool_config``, ``req_to_token_pool`` and allocator, configured on meta.  Without
    speculative decoding: nothing (no keys)."""
    rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
    spec = rc.get_spec()
    spec_mod: SGLangObject = importlib.import_module("sglang.srt.speculative.spec_info")
    algorithm = spec_mod.SpeculativeAlgorithm.from_string(spec.speculative_algorithm)
    if algorithm.is_none():
        return {}
    mc_mod: SGLangObject = importlib.import_module("sglang.srt.configs.model_config")
    aux_mod: SGLangObject = importlib.import_module(
        "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state"
    )
    draft_config = mc_mod.ModelConfig.from_server_args(
        server_args, model_path=spec.speculative_draft_model_path,
        model_revision=spec.speculative_draft_model_revision, is_draft_model=True,
    )
    kvc = _kv_configurator(
        server_args, types.SimpleNamespace(), draft_config,
        aux_mod.resolve_spec_aux_hidden_state_config(
            server_args=server_args, model_config=draft_config, spec_algorithm=algorithm,
            is_draft_worker=True,
        ),
        is_draft_worker=True, target=target,
    )
    draft = kvc.configure(pre_model_load_memory=0)
    col = _Collector()
    _collect(col, draft.token_to_kv_pool, None, notes)
    unusable = _draft_full_layers_probe(draft.token_to_kv_pool)
    if draft.token_to_kv_pool_allocator is not target.token_to_kv_pool_allocator:
        notes.append("draft: its allocator is not the target's")
    if draft.req_to_token_pool is not target.req_to_token_pool:
        notes.append("draft: its req_to_token_pool is not the target's")
    patched.append("draft worker: bare model namespace, pools built on meta with the target's "
                   "memory_pool_config, req_to_token_pool and allocator")
    return {
        "draft": {
            "algorithm": spec.speculative_algorithm,
            "num_steps": spec.speculative_num_steps,
            "eagle_topk": spec.speculative_eagle_topk,
            "num_draft_tokens": spec.speculative_num_draft_tokens,
            "architecture": draft_config.hf_config.architectures[0],
            "layers": int(kvc.layer_info.end_layer - kvc.layer_info.start_layer),
            "eagle_draft_num_layers": target_kvc.spec_aux_config.eagle_draft_num_layers,
            "token_to_kv_pool": type(draft.token_to_kv_pool).__name__,
        },
        "draft_pools": col.report(),
        **({} if unusable is None else {"draft_unusable": unusable}),
    }


def _draft_full_layers_probe(pool: SGLangObject) -> str | None:
    """A hybrid-window draft pool whose full sub-pool holds no token (built on a pipeline rank
    of window layers only: full_max_total_num_tokens 0) while its full layers exist: the
    draft's full layers write their KV at the allocator's ids (SWAKVPool.set_kv_buffer takes a
    full layer's `loc` untranslated), which its all-window allocator hands out up to the
    window pool's size, past the one padding page the full sub-pool has."""
    if type(pool).__name__ != "SWAKVPool" or not pool.full_layer_nums or pool.size:
        return None
    return (f"draft full-layer write: {pool.full_layer_nums} full layers over a full pool of "
            f"{pool.size} tokens, ids up to {pool.size_swa}")


def _graph_settings(server_args: SGLangObject) -> dict[str, Any]:
    """What SGLang's memory rule resolved beside the fraction: chunked prefill size and the
    CUDA-graph settings its reserve reads."""
    rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
    graphs = rc.get_exec().graph.cuda_graph_config
    decode, prefill = graphs.decode, graphs.prefill
    return {
        "chunked_prefill_size": server_args.resolved_dict().get("chunked_prefill_size"),
        "cuda_graph_decode_backend": decode.backend,
        "cuda_graph_decode_max_bs": decode.max_bs,
        "cuda_graph_prefill_backend": prefill.backend,
        "cuda_graph_prefill_max_bs": prefill.max_bs,
        "cuda_graph_prefill_sizes": len(prefill.bs or ()),
    }


def _num(value: float) -> int | float:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return int(value)
    return float(value)


def run_case_safely(case: dict[str, Any]) -> dict[str, Any]:
    """The report, or ``{"refused": message}`` when SGLang raises. The process environment is
    put back after each case: SGLang's argument hooks set environment variables (e.g.
    ``--rl-on-policy-target`` sets SGLANG_VLM_CACHE_SIZE_MB=0, ``--enable-symm-mem`` its
    preallocation), which would otherwise carry into the cases run after it."""
    saved = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            report = run_case(case)
    except Exception as exc:  # SGLang's refusals are plain exceptions
        report = {"refused": f"{type(exc).__name__}: {exc}"}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if "name" in case:
        report = {"case": case["name"], **report}
    return report


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    reports: list[dict[str, Any]] = []
    for name in argv:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
        loaded = json.loads(text)
        cases = loaded if isinstance(loaded, list) else [loaded]
        reports.extend(run_case_safely(case) for case in cases)
    print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
