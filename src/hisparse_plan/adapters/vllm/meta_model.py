"""A model's KV cache layers as vLLM's own model class declares them, built on the meta device.

vLLM's model code, not a reading of config.json, decides each layer's kind, heads, head size,
window and Mamba states. `kv_cache_specs` builds the model class vLLM resolves for a config.json
on the meta device (no weight is allocated or loaded), on one rank, and asks every
attention layer for its `get_kv_cache_spec`, as vLLM's GPU worker does. Layers that reuse another
layer's cache (`kv_sharing_target_layer_name`) hold no spec of their own, as in vLLM.

Two things are set up so that this runs in any process that has vLLM, GPU or not:
- On a machine where vLLM finds no GPU platform, its CPU platform is used with its config checks
  skipped for the duration of the build: they refuse CPUs without triton-cpu, and no kernel runs
  here (`vllm.platforms._current_platform` is swapped and put back; vLLM offers no other hook).
  For the same build CUDA streams stand in as inert objects (Kimi-Linear makes a side stream
  while it is built) and Kimi's GEMM + all-reduce fusion is off (`VLLM_KIMI_K3_GEMM_AR`: it
  imports the CUDA-only cute-dsl kernels, and one rank never all-reduces).
- vLLM's parallel groups are created once per process, one rank, over gloo, if none exist yet.

The config's `quantization_config` is left out of the build: it selects weight kernels, which a
meta build never runs; the cache dtype is the `kv_cache_dtype` given.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hisparse_plan.adapters.vllm.layers import layer_dicts
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.json_input import cut
from hisparse_plan.models.layer_specs import LayerSpec


@dataclass(frozen=True, slots=True)
class MetaModel:
    """What a meta build of a model gave."""

    specs: dict[str, VllmObject]
    """vLLM's `KVCacheSpec` per cache layer, in model order (one rank, tensor parallel size 1)."""
    model_class: str
    vllm_version: str
    shared: dict[str, str] = field(default_factory=dict)
    """Layers that read another layer's cache (`kv_sharing_target_layer_name`) -> that layer,
    in model order: vLLM gives them no spec (they are not in `specs`)."""
    shared_specs: dict[str, VllmObject] = field(default_factory=dict)
    """What each sharing layer's own `get_kv_cache_spec` says (its heads, window), to compare
    with the reading; vLLM never allocates it."""


def kv_cache_specs(
    config: Mapping[str, Any], *, max_model_len: int, kv_cache_dtype: str = "auto",
) -> MetaModel:
    """Build the model of `config` (a config.json's fields) with vLLM's model class on the meta
    device and return each cache layer's spec.

    Raises `UnsupportedRequestError` naming what failed: vLLM missing, no model class for the
    architectures, or the class failing to build (with vLLM's own message).
    """
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as error:
        raise UnsupportedRequestError(
            f"vllm: building layer specs with vLLM's model classes needs vLLM installed (0.33 "
            f"or 0.34), got {error}", field="vllm",
        ) from None
    # The torch backend holds every use of torch; vLLM brought torch into this process already.
    from hisparse_plan.torch.devices import meta_device

    with tempfile.TemporaryDirectory(prefix="hisparse-plan-meta-") as folder, _platform():
        data = {key: value for key, value in config.items() if key != "quantization_config"}
        (Path(folder) / "config.json").write_text(json.dumps(data), encoding="utf-8")
        vllm_config = _engine_config(folder, max_model_len, kv_cache_dtype)
        _one_rank(vllm_config)
        model_class = _model_class(vllm_config)
        from vllm.config import set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]

        from hisparse_plan.torch.vllm.model_build import constants_on_cpu

        try:
            with set_current_vllm_config(vllm_config), meta_device(), constants_on_cpu(
                    _scalar_layers()):
                model_class(vllm_config=vllm_config, prefix="")
        except Exception as error:  # vLLM's model code raises anything; name it and stop
            raise UnsupportedRequestError(
                f"vllm: {model_class.__name__} could not be built on the meta device: "
                f"{_said(error)}", field="vllm",
            ) from error
        specs: dict[str, VllmObject] = {}
        shared: dict[str, str] = {}
        shared_specs: dict[str, VllmObject] = {}
        for name, layer in vllm_config.compilation_config.static_forward_context.items():
            spec = layer.get_kv_cache_spec(vllm_config) if hasattr(
                layer, "get_kv_cache_spec") else None
            target = getattr(layer, "kv_sharing_target_layer_name", None)
            if target is not None:
                shared[name] = str(target)
                if spec is not None:
                    shared_specs[name] = spec
            elif spec is not None:
                specs[name] = spec
    return MetaModel(specs, model_class.__name__, str(vllm.__version__), shared, shared_specs)


SCALAR_LAYERS: Final = (("vllm.model_executor.layers.activation", "GeluAndMulSparse"),)
"""vLLM layers that take a Python number from a tensor while built (`constants_on_cpu`)."""


def _scalar_layers() -> list[type]:
    """The classes of `SCALAR_LAYERS` this vLLM has."""
    found = []
    for module, name in SCALAR_LAYERS:
        with contextlib.suppress(ImportError, AttributeError):
            found.append(getattr(importlib.import_module(module), name))
    return found


def _engine_config(folder: str, max_model_len: int, kv_cache_dtype: str) -> VllmObject:
    from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found, unused-ignore]

    try:
        return EngineArgs(
            model=folder, skip_tokenizer_init=True, load_format="dummy",
            max_model_len=max_model_len, enforce_eager=True, kv_cache_dtype=kv_cache_dtype,
        ).create_engine_config()
    except Exception as error:  # vLLM validates the config its own way; say what it said
        raise UnsupportedRequestError(
            f"vllm: the engine config for this model was refused: {_said(error)}",
            field="vllm",
        ) from error


def _said(error: Exception) -> str:
    """What vLLM said, in one bounded line, with where to look when it only points at its log."""
    said = f"{type(error).__name__}: {' '.join(str(error).split())}"
    if "failed to be inspected" in said:
        return (f"{cut(said, 240)} (vLLM's log above names the cause; often a package its "
                "model code imports, such as torchvision, is missing)")
    return cut(said, 300)


def _model_class(vllm_config: VllmObject) -> VllmObject:
    from vllm.model_executor.models import ModelRegistry  # type: ignore[import-not-found, unused-ignore]

    architectures = vllm_config.model_config.architectures
    try:
        model_class, _ = ModelRegistry.resolve_model_cls(
            architectures, model_config=vllm_config.model_config)
    except Exception as error:
        raise UnsupportedRequestError(
            f"architectures: vLLM could not load a model class for {architectures!r}: "
            f"{_said(error)}", field="architectures",
        ) from error
    return model_class


def _one_rank(vllm_config: VllmObject) -> None:
    """vLLM's parallel groups for a single rank, created once per process."""
    from vllm.config import set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.distributed import parallel_state  # type: ignore[import-not-found, unused-ignore]

    if parallel_state.model_parallel_is_initialized():
        return
    rendezvous = Path(tempfile.mkdtemp(prefix="hisparse-plan-rdzv-")) / "store"
    with set_current_vllm_config(vllm_config):
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"file://{rendezvous}")
        parallel_state.initialize_model_parallel(1, 1)


@contextlib.contextmanager
def _platform() -> Iterator[None]:
    """vLLM's CPU platform without its config checks while a model is built, where vLLM found
    no accelerator platform; the platform vLLM found otherwise."""
    import vllm.platforms as platforms  # type: ignore[import-not-found, unused-ignore]

    found = platforms.current_platform
    if not (found.is_unspecified() or found.is_cpu()):
        yield
        return
    from vllm.platforms.cpu import CpuPlatform  # type: ignore[import-not-found, unused-ignore]

    class MetaBuildPlatform(CpuPlatform):  # type: ignore[misc, unused-ignore]
        @classmethod
        def check_and_update_config(cls, vllm_config: VllmObject) -> None:
            del vllm_config  # no kernel runs in a meta build

    from hisparse_plan.torch.vllm.model_build import inert_cuda_streams

    platforms._current_platform = MetaBuildPlatform()
    fusion = os.environ.get(GEMM_AR)
    os.environ[GEMM_AR] = "0"
    try:
        with inert_cuda_streams():
            yield
    finally:
        platforms._current_platform = found
        if fusion is None:
            del os.environ[GEMM_AR]
        else:
            os.environ[GEMM_AR] = fusion


GEMM_AR: Final = "VLLM_KIMI_K3_GEMM_AR"
"""vLLM's switch for Kimi's fused GEMM + all-reduce, off for a meta build on a CPU."""
MODEL_FACTS: Final = (
    "kind", "num_kv_heads", "head_size", "head_size_v", "dtype", "state_content_bytes",
    "model_version", "compress_ratio", "sliding_window", "attention_chunk_size", "cache_role",
    "is_index_group_leader", "state_shapes", "state_dtypes",
)
"""The fields of a request layer that the model's code decides; the rest (block size, padding,
the Mamba cache mode's checkpoint blocks, DCP sharding, the cache format's name) are the
engine's settings."""


def check_layers_agree(layers: Mapping[str, LayerSpec], meta: MetaModel) -> None:
    """Refuse, naming the first layer and field, unless `layers` (one rank's, tensor parallel
    size 1) have exactly the cache layers of `meta`, in the same order, with the same model
    facts: then a plan of `layers` is a plan of the layers vLLM's model class builds."""
    where = f"vLLM {meta.vllm_version}'s {meta.model_class}"
    ours_shared = {name: target for name, spec in layers.items()
                   if (target := getattr(spec, "kv_sharing_target", None)) is not None}
    _check_sharing_agrees(ours_shared, meta, where)
    layers = {name: spec for name, spec in layers.items() if name not in ours_shared}
    theirs = layer_dicts(meta.specs, 0)
    if list(layers) != list(theirs):
        missing = [name for name in theirs if name not in layers]
        extra = [name for name in layers if name not in theirs]
        raise UnsupportedRequestError(
            f"layers: {where} builds {len(theirs)} cache layers, the config reading "
            f"{len(layers)}; only in vLLM's: {missing[:3]}, only in the reading: {extra[:3]}"
            + ("" if missing or extra else " (the same names in another order)"),
            field="layers",
        )
    for name, spec in layers.items():
        ours = spec.model_dump(mode="json", exclude_none=True)
        for fact in MODEL_FACTS:
            if ours.get(fact) != theirs[name].get(fact):
                raise UnsupportedRequestError(
                    f"layers[{name!r}].{fact}: {where} builds {theirs[name].get(fact)!r}, the "
                    f"config reading gives {ours.get(fact)!r}; not planned, since a plan must "
                    "hold the layers vLLM builds",
                    field=f"layers[{name!r}].{fact}",
                )


def _check_sharing_agrees(ours: Mapping[str, str], meta: MetaModel, where: str) -> None:
    """The reading shares exactly the caches vLLM's model shares, each with the target vLLM
    names, and each of vLLM's sharing layers has its target's model facts (the reading's are
    its target's by the request's own rule)."""
    for name in [*meta.shared, *ours]:
        theirs, mine = meta.shared.get(name), ours.get(name)
        if theirs != mine:
            raise UnsupportedRequestError(
                f"layers[{name!r}].kv_sharing_target: {where} reads the cache of {theirs!r}, "
                f"the config reading {mine!r}; not planned, since a plan must allocate the "
                "layers vLLM allocates",
                field=f"layers[{name!r}].kv_sharing_target",
            )
    for name, facts in layer_dicts(meta.shared_specs, 0).items():
        target = meta.shared[name]
        if target not in meta.specs:
            raise UnsupportedRequestError(
                f"layers[{name!r}].kv_sharing_target: {where} reads the cache of {target!r}, "
                "which has no KV cache spec; expected a layer that keeps its own",
                field=f"layers[{name!r}].kv_sharing_target",
            )
        kept = layer_dicts({target: meta.specs[target]}, 0)[target]
        odd = next((fact for fact in MODEL_FACTS if facts.get(fact) != kept.get(fact)), None)
        if odd is not None:
            raise UnsupportedRequestError(
                f"layers[{name!r}].{odd}: {where} builds {facts.get(odd)!r} for this layer, "
                f"which reads {target!r}'s cache of {kept.get(odd)!r}; a layer must read a "
                "cache of its own geometry",
                field=f"layers[{name!r}].{odd}",
            )
