"""vLLM 0.34's own attention-backend selection and KV-cache layout resolution, per CUDA compute
capability, run on CPU: the reference `targets/vllm/platform/` is held to.

Run it in the vLLM 0.34 venv from the repository root:

    PYTHONPATH=references:src /work/vllm-venv/bin/python references/vllm_backends.py \
        > tests/vllm_backends_cases.json
    PYTHONPATH=references:src /work/vllm-venv/bin/python references/vllm_backends.py \
        --no-flashinfer > tests/vllm_backends_cases_no_flashinfer.json

For each deployment (a model's attention layers, its KV-cache dtype, HiSparse on or off), each
capability (8.0, 8.9, 9.0, 10.0, 12.0) and each layout asked for (none, or one of the six
`VLLM_KV_CACHE_LAYOUT` values), it prints the backend vLLM selects for each layer kind
(`vllm.v1.attention.selector.get_attn_backend`, which runs `CudaPlatformBase.
get_attn_backend_cls` over `platforms/cuda.py`'s priorities; DeepSeek-V4's own classes from
`models/deepseek_v4/nvidia/model.py:_select_dsv4_attn_cls`; the indexers' fixed backends), then
the layout `vllm.v1.attention.backends.utils.resolve_kv_cache_layout` resolves from those
backends' `supported_kv_cache_layouts` (or the ValueError it raises).

Stand-ins it needs, since the machine has no GPU (each one a fact of a CUDA deployment of the
vLLM 0.34 wheel, not a change to vLLM's decisions):
- the platform: `CudaPlatformBase` with `get_device_capability` answering the capability under
  test (no NVML, no CUDA context);
- FlashInfer installed (the wheel depends on flashinfer-python): a stub `flashinfer` package,
  `has_flashinfer` and `has_flashinfer_cubin` true (pre-downloaded cubins, so
  `has_nvidia_artifactory` needs no network). `--no-flashinfer` leaves it out instead;
- vllm-flash-attn's compiled FA2/FA3 extensions present (`_vllm_fa2_C`, `_vllm_fa3_C` empty
  modules, so `FA2_AVAILABLE` and `FA3_AVAILABLE` hold);
  its kernels and `reshape_and_cache_flash` are never called;
- vLLM's compiled CUDA ops (`vllm._C_stable_libtorch`, which needs libcuda) an empty module:
  selection and resolution call none of them;
- FlashMLA's compiled extensions (`vllm._flashmla_C`, `vllm._flashmla_extension_C`) present;
- CUTLASS MLA's import-time 128 MiB workspace allocated on the meta device.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CAPABILITIES = ((8, 0), (8, 9), (9, 0), (10, 0), (12, 0))
LAYOUTS = (None, "LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")

# Each layer kind: what the model's attention layer hands `get_attn_backend` (vLLM's
# model_executor/layers/attention/attention.py and mla_attention.py), or "indexer"/"dsv4" for a
# layer whose backend the model fixes. Per rank at tp 1.
DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {"kv": "auto", "layers": {"full": {"head_size": 128}}},
    "llama-3.1-8b-fp8": {"kv": "fp8", "layers": {"full": {"head_size": 128}}},
    "gemma-3-27b": {"kv": "auto", "layers": {
        "full": {"head_size": 128}, "sliding": {"head_size": 128, "sliding": True}}},
    "gpt-oss-120b": {"kv": "auto", "layers": {
        "full": {"head_size": 64, "sink": True},
        "sliding": {"head_size": 64, "sink": True, "sliding": True}}},
    "deepseek-v3.2": {"kv": "fp8_ds_mla", "layers": {
        "sparse_mla": {"head_size": 576, "mla": True, "sparse": True, "num_heads": 128},
        "indexer": "indexer"}},
    "deepseek-v3.2-hisparse": {"kv": "fp8_ds_mla", "hisparse": True, "layers": {
        "sparse_mla": {"head_size": 576, "mla": True, "sparse": True, "num_heads": 128},
        "indexer": "indexer"}},
    "deepseek-v3.2-bf16": {"kv": "auto", "layers": {
        "sparse_mla": {"head_size": 576, "mla": True, "sparse": True, "num_heads": 128},
        "indexer": "indexer"}},
    "glm-5": {"kv": "fp8_ds_mla", "layers": {
        "sparse_mla": {"head_size": 576, "mla": True, "sparse": True, "num_heads": 64},
        "indexer": "indexer"}},
    "glm-5-hisparse": {"kv": "fp8_ds_mla", "hisparse": True, "layers": {
        "sparse_mla": {"head_size": 576, "mla": True, "sparse": True, "num_heads": 64},
        "indexer": "indexer"}},
    "deepseek-v4-flash": {"kv": "fp8_ds_mla", "layers": {"dsv4": "dsv4"}},
    "kimi-k2": {"kv": "auto", "layers": {
        "mla": {"head_size": 576, "mla": True, "num_heads": 64}}},
}


OVERRIDES = (
    ("llama-3.1-8b", (10, 0), "FLASH_ATTN"),
    ("llama-3.1-8b", (10, 0), "TRITON_ATTN"),
    ("llama-3.1-8b", (9, 0), "FLASHINFER"),
    ("llama-3.1-8b-fp8", (8, 0), "FLASH_ATTN"),
    ("deepseek-v3.2", (9, 0), "FLASHINFER_MLA_SPARSE"),
    ("deepseek-v3.2", (10, 0), "FLASHINFER_MLA_SPARSE"),
    ("kimi-k2", (10, 0), "TRITON_MLA"),
    ("deepseek-v4-flash", (9, 0), "FLASHINFER_MLA_SPARSE_DSV4"),
)
"""`--attention-backend` cases (vLLM's `AttentionConfig.backend`), layout not given."""


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> mock.MagicMock:
        module = mock.MagicMock(name=spec.name)
        module.__name__, module.__spec__, module.__path__ = spec.name, spec, []
        module.__version__ = "0.7.3"  # the wheel pins flashinfer-python==0.7.3
        return module

    def exec_module(self, module: object) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] == "flashinfer":
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        return None


_CAPABILITY: list[tuple[int, int]] = [(9, 0)]


def _module(name: str) -> Any:  # noqa: ANN401
    """A vLLM module (typed loosely: vLLM ships no stubs)."""
    return importlib.import_module(name)

_BASE: list[Any] = []


def install_stand_ins(flashinfer: bool) -> None:
    """The platform, FlashInfer, vllm-flash-attn and CUTLASS MLA stand-ins (module docstring);
    call before anything imports a backend."""
    import types

    import torch
    platforms = _module("vllm.platforms")

    # HiSparse's connector (read for its required layout) imports worker code that queries
    # compiled CUTLASS ops at import; it is imported on the CPU platform first. Nothing it binds
    # takes part in selection or layout resolution.
    importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector")
    # A VllmConfig is built once on the CPU platform (which refuses x86 without Triton while
    # building one; planning never runs Triton) and copied per case.
    VllmConfig = _module("vllm.config").VllmConfig
    triton_utils: Any = importlib.import_module("vllm.triton_utils")
    saved, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
    try:
        _BASE.append(VllmConfig())
    finally:
        triton_utils.HAS_TRITON = saved
    try:
        importlib.import_module("vllm._C_stable_libtorch")
    except ImportError:  # needs libcuda; its ops are never called here
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    CudaPlatformBase = _module("vllm.platforms.cuda").CudaPlatformBase
    DeviceCapability = _module("vllm.platforms.interface").DeviceCapability

    class StandIn(CudaPlatformBase):  # type: ignore[misc, valid-type]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:  # noqa: ANN401
            return DeviceCapability(*_CAPABILITY[0])

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "stand-in"

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return 132

    cpu = platforms.current_platform
    stand_in = StandIn()
    platforms._current_platform = stand_in
    # Modules imported so far bound the CPU platform by name; they see the stand-in too.
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.") and vars(module).get("current_platform") is cpu:
            setattr(module, "current_platform", stand_in)  # noqa: B010
    fa_utils = importlib.import_module("vllm.v1.attention.backends.fa_utils")
    if flashinfer:
        sys.meta_path.insert(0, _StubFinder())
        fi = importlib.import_module("vllm.utils.flashinfer")
        for check in ("has_flashinfer", "has_flashinfer_cubin"):
            setattr(fi, check, lambda: True)
    else:
        sys.modules["flashinfer"] = None  # type: ignore[assignment]
    for name in ("vllm._flashmla_C", "vllm._flashmla_extension_C"):  # FlashMLA's, likewise
        sys.modules.setdefault(name, types.ModuleType(name))
    for extension in ("_vllm_fa2_C", "_vllm_fa3_C"):  # present in a CUDA wheel; need libcuda
        name = f"vllm.vllm_flash_attn.{extension}"
        sys.modules.setdefault(name, types.ModuleType(name))
    interface = importlib.import_module("vllm.vllm_flash_attn.flash_attn_interface")
    ops = _module("vllm._custom_ops")
    if not hasattr(ops, "reshape_and_cache_flash"):
        ops.reshape_and_cache_flash = lambda *a, **k: None
    # fa_utils took its CPU branch when first imported: the names its CUDA branch imports.
    setattr(fa_utils, "reshape_and_cache_flash", ops.reshape_and_cache_flash)  # noqa: B010
    for name in ("compile_flash_attn_varlen_func_from_specs", "flash_attn_varlen_func",
                 "get_scheduler_metadata"):
        setattr(fa_utils, name, getattr(interface, name))
    empty = torch.empty

    def meta_empty(*args: object, **kwargs: object) -> torch.Tensor:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "meta"
        return empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    with mock.patch.object(torch, "empty", meta_empty):
        importlib.import_module("vllm.v1.attention.backends.mla.cutlass_mla")


@contextlib.contextmanager
def capability(value: tuple[int, int]) -> Iterator[None]:
    _CAPABILITY[0] = value
    cuda = _module("vllm.platforms.cuda")
    selector = _module("vllm.v1.attention.selector")
    cuda._get_backend_priorities.cache_clear()
    with contextlib.suppress(AttributeError):
        selector._cached_get_attn_backend.cache_clear()
    yield


def _config(deployment: dict[str, Any], backend: str | None) -> Any:  # noqa: ANN401
    import copy

    KVTransferConfig = _module("vllm.config").KVTransferConfig
    AttentionBackendEnum = _module(
        "vllm.v1.attention.backends.registry").AttentionBackendEnum

    config = copy.deepcopy(_BASE[0])
    config.attention_config.backend = AttentionBackendEnum[backend] if backend else None
    config.cache_config.cache_dtype = deployment["kv"]
    if deployment.get("hisparse"):
        config.kv_transfer_config = KVTransferConfig(
            kv_connector="HiSparseConnector", kv_role="kv_both")
    return config


def _backends(deployment: dict[str, Any], config: Any) -> dict[str, Any]:  # noqa: ANN401
    """Each layer kind's backend class, or the ValueError vLLM raises."""
    import torch
    set_current_vllm_config = _module("vllm.config").set_current_vllm_config
    get_attn_backend = _module("vllm.v1.attention.selector").get_attn_backend

    chosen: dict[str, Any] = {}
    with set_current_vllm_config(config):
        for kind, layer in deployment["layers"].items():
            try:
                if layer == "indexer":
                    chosen[kind] = importlib.import_module(
                        "vllm.v1.attention.backends.mla.indexer").DeepseekV32IndexerBackend
                elif layer == "dsv4":
                    model = importlib.import_module("vllm.models.deepseek_v4.nvidia.model")
                    attention = model._select_dsv4_attn_cls(config)
                    chosen["dsv4_mla"] = attention.backend_cls
                    chosen["dsv4_swa"] = attention.swa_backend_cls
                    chosen["dsv4_compressor"] = importlib.import_module(
                        "vllm.models.deepseek_v4.compressor").CompressorBackend
                    chosen["dsv4_indexer"] = importlib.import_module(
                        "vllm.v1.attention.backends.mla.indexer").DeepseekV4IndexerBackend
                else:
                    kv = deployment["kv"]
                    chosen[kind] = get_attn_backend(
                        layer["head_size"], torch.bfloat16, kv,
                        use_mla=layer.get("mla", False), has_sink=layer.get("sink", False),
                        use_sparse=layer.get("sparse", False),
                        num_heads=layer.get("num_heads"),
                        has_sliding_window=layer.get("sliding", False),
                    )
            except (ValueError, ImportError) as error:
                chosen[kind] = error
    return chosen


def _specs(deployment: dict[str, Any]) -> list[Any]:
    """Specs standing for the deployment's layers in the mixed-shape rule: what decides it is
    each spec's (heads, states, page bytes), and whether the layers differ in it."""
    from types import SimpleNamespace

    shapes = {kind: (1 if isinstance(layer, str) or layer.get("mla") else 2)
              for kind, layer in deployment["layers"].items()}
    if "dsv4" in deployment["layers"] or "indexer" in deployment["layers"] \
            or deployment.get("hisparse"):
        return [SimpleNamespace(has_layer_views=True, num_heads=1, num_states=1,
                                page_size_bytes=size) for size in (41984, 8448)]
    return [SimpleNamespace(has_layer_views=True, num_heads=8, num_states=states,
                            page_size_bytes=1) for states in set(shapes.values())]


def resolve(name: str, cap: tuple[int, int], layout: str | None, *,
            backend: str | None = None, extensible: bool = True) -> dict[str, Any]:
    utils = _module("vllm.v1.attention.backends.utils")
    get_supported_kv_cache_layouts = utils.get_supported_kv_cache_layouts
    resolve_kv_cache_layout = utils.resolve_kv_cache_layout

    deployment = DEPLOYMENTS[name]
    with capability(cap):
        config = _config(deployment, backend)
        config.cache_config.enable_extensible_kv_cache = extensible
        chosen = _backends(deployment, config)
        case: dict[str, Any] = {
            "deployment": name, "capability": f"{cap[0]}.{cap[1]}", "layout": layout,
            "attention_backend": backend,
            "backends": {kind: (f"error: {value}" if isinstance(value, Exception)
                                else value.get_name()) for kind, value in chosen.items()},
        }
        classes = [value for value in chosen.values() if not isinstance(value, Exception)]
        if len(classes) < len(chosen):
            case["resolved"] = None
            case["refused"] = "no backend"
            return case
        if layout is None:
            os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
        else:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = layout
        try:
            supported = [layout.name for layout in get_supported_kv_cache_layouts(classes)]
            case["supported"] = supported
            resolved = resolve_kv_cache_layout(config, [supported], _specs(deployment))
            case["resolved"], case["refused"] = resolved.name, None
        except ValueError as error:
            case["resolved"], case["refused"] = None, str(error)
        finally:
            os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-flashinfer", action="store_true")
    args = parser.parse_args()
    install_stand_ins(flashinfer=not args.no_flashinfer)
    cases = [resolve(name, cap, layout) for name in DEPLOYMENTS for cap in CAPABILITIES
             for layout in LAYOUTS]
    cases += [resolve(name, cap, None, backend=backend) for name, cap, backend in OVERRIDES]
    json.dump({"flashinfer": not args.no_flashinfer, "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
