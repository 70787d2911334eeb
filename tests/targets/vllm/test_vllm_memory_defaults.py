"""Issue 28: `--gpu` takes the chosen vLLM's own memory default, for both of 0.34's sizing modes.

vLLM's source, as installed (vLLM 0.34.0 and 0.33.0 wheels):

- 0.34 `vllm/config/cache.py`: line 185 `DEFAULT_GPU_MEMORY_UTILIZATION: ClassVar[float] =
  0.92`; line 216 `gpu_memory_utilization: float | None = Field(default=None, ...)`; lines
  495-501 `resolved_gpu_memory_utilization`: the value when set, else 1.0 when
  `enable_extensible_kv_cache`, else `DEFAULT_GPU_MEMORY_UTILIZATION`.
- 0.34 `vllm/config/vllm.py`: lines 3180-3262 `_resolve_extensible_kv_cache`: an unset
  `enable_extensible_kv_cache` is on where the platform is CUDA or ROCm unless
  `kv_cache_memory_bytes` or `num_gpu_blocks_override` is set (or elastic EP, or a KV
  connector that cannot use driver-mapped memory); asked for where unsupported, it is refused.
- 0.33 `vllm/config/cache.py`: line 215 `gpu_memory_utilization: float = Field(default=0.92,
  ...)`; 0.33 has no extensible KV cache. (Issue 28 said 0.9 for 0.33; the source says 0.92.)

The first tests pin those figures without vLLM (CI); the last ones compute them from vLLM's own
`CacheConfig` and `VllmConfig._resolve_extensible_kv_cache` where vLLM is installed.
"""

from __future__ import annotations

import importlib
import json
import math
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest

from hisparse_plan.presets import ConfigError
from hisparse_plan.presets.hardware import find_gpu, memory_breakdown, memory_sizing
from support.cli_support import Run

GIB = 2**30
H100_HBM = 81559 * 2**20
LLAMA_70B_BYTES = 70_600_000_000 * 2
"""Llama-3.1-70B's bf16 weights, as the preset counts them."""


def test_vllm_034_defaults_as_its_source_says() -> None:
    measured = memory_sizing("0.34")
    assert (measured.extensible, measured.utilization, measured.given) == (True, "1.0", False)
    profiled = memory_sizing("0.34", extensible=False)
    assert (profiled.extensible, profiled.utilization) == (False, "0.92")
    # kv_cache_memory_bytes or num_gpu_blocks_override turn the extensible KV cache off.
    assert memory_sizing("0.34", kv_cache_memory_given=True).utilization == "0.92"
    assert memory_sizing("0.34", num_blocks_override_given=True).extensible is False
    given = memory_sizing("0.34", gpu_memory_utilization="0.85")
    assert (given.extensible, given.utilization, given.given) == (True, "0.85", True)


def test_vllm_033_default_as_its_source_says() -> None:
    sizing = memory_sizing("0.33")
    assert (sizing.extensible, sizing.utilization) == (False, "0.92")


@pytest.mark.parametrize(("version", "memory", "override", "why"), [
    ("0.33", False, False, "vLLM 0.33 has no extensible KV cache"),
    ("0.34", True, False, "which kv_cache_memory_bytes overrides"),
    ("0.34", False, True, "which num_gpu_blocks_override overrides"),
])
def test_the_extensible_kv_cache_asked_where_vllm_refuses_it(
    version: Any, memory: bool, override: bool, why: str
) -> None:
    with pytest.raises(ConfigError, match=why) as refused:
        memory_sizing(version, extensible=True, kv_cache_memory_given=memory,
                      num_blocks_override_given=override)
    assert refused.value.field == "enable_extensible_kv_cache"


def test_the_library_default_is_vllm_034_on_cuda() -> None:
    """memory_breakdown without a share takes 1.0: nothing held back (it was 0.9 before)."""
    split = memory_breakdown(find_gpu("h100"), LLAMA_70B_BYTES, tp=2)
    assert split.held_back == 0
    assert split.kv_cache == H100_HBM - LLAMA_70B_BYTES // 2 - 4 * GIB


def _fitted(kv_bytes: int, block: int) -> int:
    """The auto-fitted length of Llama-3.1-70B at TP 2 with fp8 KV: 80 layers x (K, V) x 4 heads
    x 128 x 1 byte a token; one block is kept for the null block."""
    block_bytes = 80 * 2 * 4 * 128 * block
    return (kv_bytes // block_bytes - 1) * block


def _kv_bytes(utilization: str) -> int:
    budget = math.ceil(H100_HBM * Fraction(utilization))  # vLLM: ceil(total x utilization)
    return budget - LLAMA_70B_BYTES // 2 - 4 * GIB


@pytest.mark.parametrize(("flags", "utilization", "block", "tokens"), [
    ((), "1", 64, 129_600),
    (("--no-enable-extensible-kv-cache",), "0.92", 64, 46_080),
    (("--vllm", "0.33"), "0.92", 16, 46_176),
    (("--gpu-memory-utilization", "0.9"), "0.9", 64, 25_216),
])
def test_llama_70b_on_two_h100_fits_what_the_vllm_default_leaves(
    cli: Run, flags: tuple[str, ...], utilization: str, block: int, tokens: int
) -> None:
    """The issue's figures: 129,600 tokens at 1.0, 46,080 at 0.92, 25,216 at 0.9."""
    assert _fitted(_kv_bytes(utilization), block) == tokens
    code, out, err = cli("plan", "llama-3-70b", "--gpu", "h100", "-tp", "2",
                         "--kv-cache-dtype", "fp8", "--max-model-len", "auto", "--json", *flags)
    assert code == 0, err
    body = json.loads(out)
    assert body["plan"]["fitted_max_model_len"] == tokens
    sizing = body["memory"]["sizing"]
    assert float(sizing["gpu_memory_utilization"]) == float(utilization)
    held_back = {row["part"]: row["bytes"] for row in body["memory"]["per_rank"]}["held_back"]
    assert held_back == H100_HBM - (_kv_bytes(utilization) + LLAMA_70B_BYTES // 2 + 4 * GIB)


def test_the_heading_says_what_the_gpu_memory_assumed(cli: Run) -> None:
    code, out, err = cli("plan", "llama-3-70b", "--gpu", "h100", "-tp", "2", "--kv-cache-dtype",
                         "fp8", "--max-model-len", "auto", "--plain")
    assert code == 0, err
    heading = out.splitlines()[0]
    assert ("on h100, gpu_memory_utilization 1.0 (vLLM 0.34's default, extensible KV cache)"
            in heading)
    sizing = next(line for line in out.splitlines() if line.startswith("sizing: "))
    assert "after warm-up and CUDA graph capture" in sizing
    assert "other processes on the GPU" in sizing
    code, out, err = cli("plan", "llama-3-70b", "--gpu", "h100", "-tp", "2", "--kv-cache-dtype",
                         "fp8", "--max-model-len", "auto", "--vllm", "0.33", "--plain")
    assert code == 0, err
    assert "gpu_memory_utilization 0.92 (vLLM 0.33's default, profiled KV cache)" in out
    code, out, err = cli("capacity", "deepseek-v3.2", "--gpu", "h200", "-tp", "8", "--plain")
    assert code == 0, err
    assert out.startswith("DeepSeek-V3.2 on h200, gpu_memory_utilization 1.0 (vLLM 0.34's "
                          "default, extensible KV cache): ")


@pytest.mark.parametrize(("argv", "message"), [
    (("--enable-extensible-kv-cache",), "--[no-]enable-extensible-kv-cache needs --gpu NAME"),
    (("--gpu", "h100", "-tp", "2", "--vllm", "0.33", "--enable-extensible-kv-cache"),
     "enable_extensible_kv_cache: expected it off here, got on: vLLM 0.33 has no extensible"),
    (("--gpu", "h100", "-tp", "2", "--kv-cache-memory", "8GiB", "--enable-extensible-kv-cache"),
     "which kv_cache_memory_bytes overrides"),
])
def test_extensible_kv_cache_flag_refusals(
    cli: Run, argv: tuple[str, ...], message: str
) -> None:
    code, out, err = cli("plan", "llama-3-70b", "--max-model-len", "8192", *argv)
    assert (code, out) == (2, "")
    assert message in err


# -- computed by vLLM itself -------------------------------------------------------------------


def _vllm_config_module() -> Any:
    pytest.importorskip("vllm")
    return importlib.import_module("vllm.config")


@pytest.mark.parametrize("extensible", [True, False])
def test_vllm_cache_config_resolves_our_default(extensible: bool) -> None:
    config = _vllm_config_module()
    version = importlib.import_module("vllm").__version__
    if version.startswith("0.33"):
        cache = config.CacheConfig()
        assert memory_sizing("0.33").utilization == f"{cache.gpu_memory_utilization:g}"
        return
    cache = config.CacheConfig(enable_extensible_kv_cache=extensible)
    ours = memory_sizing("0.34", extensible=extensible)
    assert float(ours.utilization) == cache.resolved_gpu_memory_utilization
    set_share = config.CacheConfig(enable_extensible_kv_cache=extensible,
                                   gpu_memory_utilization=0.85)
    assert set_share.resolved_gpu_memory_utilization == float(
        memory_sizing("0.34", extensible=extensible, gpu_memory_utilization="0.85").utilization)


@pytest.mark.parametrize(("memory", "override"), [(None, None), (8 * GIB, None), (None, 1000)])
def test_vllm_resolves_the_sizing_mode_on_cuda_as_we_do(
    monkeypatch: pytest.MonkeyPatch, memory: int | None, override: int | None
) -> None:
    """vLLM's own `_resolve_extensible_kv_cache` on a CUDA platform (the platform's answer
    patched: this machine has none), with and without what turns the mode off."""
    config = _vllm_config_module()
    if not hasattr(config.VllmConfig, "_resolve_extensible_kv_cache"):
        pytest.skip("this vLLM has no extensible KV cache")
    platforms = importlib.import_module("vllm.platforms")
    monkeypatch.setattr(type(platforms.current_platform), "is_cuda_alike",
                        lambda self: True, raising=False)
    cache = config.CacheConfig(kv_cache_memory_bytes=memory, num_gpu_blocks_override=override)
    engine = SimpleNamespace(
        cache_config=cache, kv_transfer_config=None,
        parallel_config=SimpleNamespace(enable_elastic_ep=False),
    )
    config.VllmConfig._resolve_extensible_kv_cache(engine)
    ours = memory_sizing("0.34", kv_cache_memory_given=memory is not None,
                         num_blocks_override_given=override is not None)
    assert cache.enable_extensible_kv_cache is ours.extensible
    assert cache.resolved_gpu_memory_utilization == float(ours.utilization)
