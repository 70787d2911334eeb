"""Each tests/hf_configs model built with vLLM's own model classes on the meta device, on a
CPU, and its KV cache layers compared with the ones hisparse_plan plans from the same
config.json. Needs vLLM (run it in the vLLM venv, with this checkout's sources first):

    PYTHONPATH=src /work/vllm34/bin/python benchmarks/vllm_hf_layers.py [NAME ...]

A CUDA build of vLLM on a machine without a GPU has no platform, so the model is built under
vLLM's CPU platform with its config checks skipped (they refuse CPUs without triton-cpu; no
kernel runs here), and packages that model modules import but the cache layout never runs
(torchvision, compressed_tensors, einops) are stood in for. The quantization_config is
dropped: it changes no cache layer. Each model runs in its own process (vLLM's parallel groups
are set up once per process, for that model).

Compared per cache layer, by vLLM's layer name: the spec kind (full, sliding, chunked, MLA,
Mamba), KV heads and head size, the sliding window or attention chunk, and a Mamba layer's
state shapes and dtypes (tp 1). Sparse-MLA models (DeepSeek-V3.2, GLM-5) cannot be built on a
CPU; refused configs must be refused by vLLM too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "hf_configs"
STUBS = '''
import importlib.abc, importlib.machinery, sys, types
from unittest import mock


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in ("torchvision", "compressed_tensors", "einops"):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
'''
Row = tuple[Any, ...]


def vllm_layers(config_path: Path) -> dict[str, Row]:
    """vLLM's cache layers for the config: name -> (kind, heads, head size, window, states)."""
    import torch
    import vllm.platforms as platforms  # type: ignore[import-not-found, unused-ignore]
    from vllm.platforms.cpu import CpuPlatform  # type: ignore[import-not-found, unused-ignore]

    class ProbePlatform(CpuPlatform):  # type: ignore[misc, unused-ignore]
        @classmethod
        def check_and_update_config(cls, vllm_config: object) -> None:
            del vllm_config

    platforms._current_platform = ProbePlatform()
    from vllm.config import set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.distributed import (  # type: ignore[import-not-found, unused-ignore]
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.models import (  # type: ignore[import-not-found, unused-ignore]
        ModelRegistry,
    )

    folder = Path(tempfile.mkdtemp())
    raw = json.loads(config_path.read_text())
    raw.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(raw))
    config = EngineArgs(model=str(folder), skip_tokenizer_init=True, load_format="dummy",
                        max_model_len=4096, enforce_eager=True).create_engine_config()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:29541")
        initialize_model_parallel(1, 1)
    model_class, _ = ModelRegistry.resolve_model_cls(config.model_config.architectures,
                                                     model_config=config.model_config)
    with set_current_vllm_config(config), torch.device("meta"):
        model_class(vllm_config=config, prefix="")
    layers: dict[str, Row] = {}
    for name, layer in config.compilation_config.static_forward_context.items():
        spec = layer.get_kv_cache_spec(config) if hasattr(layer, "get_kv_cache_spec") else None
        if spec is None:
            continue
        kind = type(spec).__name__
        if kind == "MambaSpec":
            states = ([list(shape) for shape in spec.shapes],
                      [str(dtype).removeprefix("torch.") for dtype in spec.dtypes])
            layers[name] = ("mamba", None, None, None, states)
        else:
            window = getattr(spec, "sliding_window", None) or getattr(
                spec, "attention_chunk_size", None)
            heads = None if kind == "MLAAttentionSpec" else spec.num_kv_heads
            layers[name] = (kind, heads, spec.head_size, window, None)
    return layers


KINDS = {"full_attention": "FullAttentionSpec", "sliding_window": "SlidingWindowSpec",
         "chunked_local_attention": "ChunkedLocalAttentionSpec", "mla": "MLAAttentionSpec"}


def planned_layers(config_path: Path) -> dict[str, Row] | str:
    """The layers hisparse_plan plans for the config (tp 1), or the field it refuses."""
    from hisparse_plan.presets import ConfigError, RegularArchitecture, Settings, build_request
    from hisparse_plan.presets.config_file import load_config_file

    try:
        arch = load_config_file(config_path)
    except ConfigError as error:
        return f"refused: {error.field}"
    if not isinstance(arch, RegularArchitecture):
        return "sparse MLA"
    request = build_request(arch, Settings(max_model_len=4096))
    layers: dict[str, Row] = {}
    for name, spec in request.layers.items():
        data = spec.model_dump()
        if data["kind"] == "mamba":
            layers[name] = ("mamba", None, None, None,
                            (data["state_shapes"], data["state_dtypes"]))
        else:
            window = data.get("sliding_window") or data.get("attention_chunk_size")
            heads = None if data["kind"] == "mla" else data["num_kv_heads"]
            layers[name] = (KINDS[data["kind"]], heads, data["head_size"], window, None)
    return layers


def compare_one(name: str) -> str:
    path = CONFIGS / name / "config.json"
    ours = planned_layers(path)
    try:
        theirs: dict[str, Row] | str = vllm_layers(path)
    except Exception as error:  # any failure to build is reported as such
        theirs = f"vLLM cannot build it: {type(error).__name__}: {str(error)[:120]}"
    if isinstance(ours, str) or isinstance(theirs, str):
        return f"{name}: ours {ours if isinstance(ours, str) else 'planned'}; {theirs}"
    if ours == theirs:
        kinds = sorted({row[0] for row in ours.values()})
        return f"{name}: SAME {len(ours)} layers ({', '.join(kinds)})"
    differ = sorted(set(ours) ^ set(theirs)) or [n for n in ours if ours[n] != theirs[n]]
    first = differ[0]
    return f"{name}: DIFFER at {first}: ours {ours.get(first)}, vLLM {theirs.get(first)}"


def main() -> int:
    names = sys.argv[1:] or sorted(path.name for path in CONFIGS.iterdir())
    if os.environ.get("HF_LAYERS_ONE"):
        print(compare_one(names[0]), flush=True)
        return 0
    stubs = Path(tempfile.mkdtemp())
    (stubs / "sitecustomize.py").write_text(STUBS)
    env = {**os.environ, "HF_LAYERS_ONE": "1", "VLLM_LOGGING_LEVEL": "ERROR",
           "PYTHONPATH": os.pathsep.join(
               [str(stubs), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for name in names:
        done = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith(name)]
        print(lines[-1] if lines else f"{name}: no result ({done.stderr.strip()[-200:]})",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
