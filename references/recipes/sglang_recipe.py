"""hisparse_plan beside SGLang 0.5.23: a request from SGLang's own ServerArgs, the plan, and the
keyword arguments of each SGLang pool class, checked against that class's constructor.

Run it in SGLang's venv, the project on PYTHONPATH (references/sglang_stubs stands in for
torchvision, which pool code never calls):

    PYTHONPATH=src:references/sglang_stubs /work/sglang/bin/python \\
        references/recipes/sglang_recipe.py
"""

from __future__ import annotations

import importlib
import inspect
import json
import tempfile
from pathlib import Path

import sglang  # type: ignore[import-not-found, unused-ignore]
from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found, unused-ignore]

from hisparse_plan.adapters.sglang import (
    pool_kwargs,
    request_from_server_args,
    request_from_sglang,
)
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.presets import load_preset
from hisparse_plan.targets.sglang import plan_sglang

GIB = 2**30
MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "head_dim": 64,
}
POOL_MODULES = (
    "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.hisparse_memory_pool",
)
"""Where SGLang 0.5.23 defines the pool classes pool_kwargs names."""
RUNTIME = {"device": "cuda", "enable_memory_saver": False}
"""What the serving process adds: the plan says how big, not where or how it is allocated."""


def sglang_class(name: str) -> type:
    """The SGLang pool class named `name`."""
    for module_name in POOL_MODULES:
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            found: type = getattr(module, name)
            return found
    raise SystemExit(f"FAIL: SGLang {sglang.__version__} has no pool class {name}")


def bind_pools(plan: SGLangPlan) -> list[str]:
    """Each pool_kwargs dict bound to its SGLang class's constructor; what does not bind."""
    failed = []
    for pool, kwargs in pool_kwargs(plan).items():
        arguments = dict(kwargs)
        cls = sglang_class(arguments.pop("class"))
        parameters = inspect.signature(cls).parameters
        runtime = {key: value for key, value in RUNTIME.items() if key in parameters}
        try:
            inspect.signature(cls).bind(**arguments, **runtime)
            verdict = "binds"
        except TypeError as error:
            failed.append(f"{pool}: {error}")
            verdict = f"does not bind ({error})"
        print(f"  {pool}: {cls.__module__}.{cls.__name__}({', '.join(arguments)}, "
              f"+ {', '.join(runtime)}) {verdict}")
    return failed


def main() -> None:
    print(f"SGLang {sglang.__version__}")
    # A model SGLang serves, from its own ServerArgs (the model read from model_path).
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(MODEL))
        server_args = ServerArgs(model_path=model_dir, page_size=16, context_length=4096,
                                 tp_size=1, skip_tokenizer_init=True, load_format="dummy")
        # memory: {"available_bytes": N} (the KV cache's bytes), or what SGLang measures:
        # {"pre_model_load_free_bytes": N, "post_weights_free_bytes": M}.
        request = request_from_sglang(server_args, {"available_bytes": 4 * GIB})
    plan = plan_sglang(request)
    print(f"Llama, ServerArgs: {plan.max_total_num_tokens} tokens, "
          f"{plan.max_running_requests} requests")
    failed = bind_pools(plan)

    # DeepSeek-V3.2 with HiSparse, from a dict of server arguments and a preset's architecture
    # (a config.json dict or path works the same).
    server_args = {"tp_size": 1, "context_length": 4096, "kv_cache_dtype": "fp8_e4m3",
                   "dsa_backend": "flashmla_kv", "enable_hisparse": True,
                   "hisparse_config": {"top_k": 2048, "host_to_device_ratio": 4}}
    architecture = load_preset("deepseek-v3.2").architecture
    sparse = plan_sglang(request_from_server_args(architecture, server_args,
                                                  {"available_bytes": 2 * GIB}))
    print(f"DeepSeek-V3.2 + HiSparse, dict: {sparse.max_total_num_tokens} tokens, "
          f"{sparse.max_running_requests} requests")
    failed += bind_pools(sparse)
    if failed:
        raise SystemExit("FAIL: " + "; ".join(failed))
    print("PASS")


if __name__ == "__main__":
    main()
