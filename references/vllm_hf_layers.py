"""Each tests/hf_configs model built with vLLM's own model classes on the meta device, on a
CPU, and its KV cache layers compared with the ones hisparse_plan plans from the same
config.json. Needs vLLM (run it in the vLLM venv, with this checkout's sources first):

    PYTHONPATH=src /work/vllm34/bin/python references/vllm_hf_layers.py [NAME ...]

The build is the one `plan --hf-config X --specs-from-vllm` runs
(`hisparse_plan.adapters.vllm.meta_model`); here packages that model modules import but the
cache layout never runs (torchvision, compressed_tensors, einops, and mistral_common, Mistral's
tokenizer and request types that `models/pixtral.py` imports for Llava, Mistral-3 and Voxtral)
are stood in for, so that the multimodal wrappers build on a CPU-only venv too. Each model runs
in its own process.

Compared per cache layer, by vLLM's layer name (`check_layers_agree`): the spec kind, KV heads,
head sizes, dtypes, the sliding window or attention chunk, MLA rows, and a Mamba layer's state
shapes and dtypes (tp 1). Sparse-MLA models (DeepSeek-V3.2, GLM-5) cannot be built on a CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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


_STOOD_IN = ("torchvision", "compressed_tensors", "einops", "mistral_common")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in _STOOD_IN:
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


def compare_one(name: str) -> str:
    """One config: refused by our reading (naming the field), not buildable by vLLM here, or
    the layers of both compared (`check_layers_agree`)."""
    from hisparse_plan.adapters.vllm.meta_model import check_layers_agree, kv_cache_specs
    from hisparse_plan.errors import PlanError
    from hisparse_plan.presets import ConfigError, Settings, build_request
    from hisparse_plan.presets.config_file import load_config_file

    path = CONFIGS / name / "config.json"
    try:
        request = build_request(load_config_file(path), Settings(max_model_len=4096))
    except ConfigError as error:
        return f"{name}: ours refused: {error.field}"
    try:
        meta = kv_cache_specs(json.loads(path.read_text()), max_model_len=4096)
    except PlanError as error:
        return f"{name}: vLLM cannot build it here: {str(error)[:160]}"
    try:
        check_layers_agree(request.layers, meta)
    except PlanError as error:
        return f"{name}: DIFFER {error}"
    kinds = sorted({spec.kind for spec in request.layers.values()})
    return f"{name}: SAME {len(meta.specs)} layers ({', '.join(kinds)}) as {meta.model_class}"


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
