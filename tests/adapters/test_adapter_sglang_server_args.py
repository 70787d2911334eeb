"""`request_from_sglang`: SGLang's ServerArgs object read by attribute name (SGLang itself is
not needed: its object is stood in for by one with its attribute names and many others)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hisparse_plan.adapters.sglang import (
    request_from_server_args,
    request_from_sglang,
    server_args_mapping,
)
from hisparse_plan.errors import PlanError
from support import paths

CONFIGS = paths.HF_CONFIGS
MEMORY = {"available_bytes": 8 * 2**30}


def server_args(**given: object) -> SimpleNamespace:
    """An object shaped like SGLang's ServerArgs: the fields the plan reads, unset (None) ones,
    and fields it does not read."""
    fields: dict[str, object] = {
        "model_path": str(CONFIGS / "deepseek-v3.2-exp"), "tp_size": 8, "page_size": 64,
        "kv_cache_dtype": "fp8_e4m3", "context_length": 8192, "max_running_requests": None,
        "mem_fraction_static": 0.88, "dsa_prefill_backend": "flashmla_sparse",
        "dsa_decode_backend": "flashmla_kv", "enable_hisparse": False,
        "hisparse_config": None, "disable_cuda_graph": False, "log_level": "info",
        "port": 30000, "enable_metrics": True,
    }
    fields.update(given)
    return SimpleNamespace(**fields)


def test_only_the_pool_moving_arguments_are_read() -> None:
    mapping = server_args_mapping(server_args())
    assert mapping == {"tp_size": 8, "page_size": 64, "kv_cache_dtype": "fp8_e4m3",
                       "context_length": 8192, "mem_fraction_static": 0.88,
                       "enable_hisparse": False}


@pytest.mark.parametrize(("prefill", "decode", "backend"), [
    ("trtllm", "trtllm", "trtllm"), ("flashmla_sparse", "trtllm", "trtllm"),
    ("tilelang", "tilelang", "tilelang"), ("tilelang", "flashmla_kv", None),
])
def test_the_dsa_backend_follows_sglangs_two_roles(
    prefill: str, decode: str, backend: str | None
) -> None:
    mapping = server_args_mapping(server_args(dsa_prefill_backend=prefill,
                                              dsa_decode_backend=decode))
    assert mapping.get("dsa_backend") == backend


def test_hisparse_and_graph_switches() -> None:
    mapping = server_args_mapping(server_args(
        enable_hisparse=True, hisparse_config='{"top_k": 1024, "host_to_device_ratio": 4}',
        disable_cuda_graph=True))
    assert mapping["hisparse_config"] == {"top_k": 1024, "host_to_device_ratio": 4}
    assert mapping["disable_decode_cuda_graph"] is mapping["disable_prefill_cuda_graph"] is True


def test_the_request_is_the_one_the_server_args_dict_gives() -> None:
    args = server_args(enable_hisparse=True, hisparse_config={"top_k": 1024})
    ours = request_from_sglang(args, MEMORY)
    assert ours == request_from_server_args(
        CONFIGS / "deepseek-v3.2-exp" / "config.json", server_args_mapping(args), MEMORY)
    assert ours.engine is not None
    assert (ours.engine.enable_hisparse, ours.engine.hisparse_top_k) == (True, 1024)


def test_a_model_path_without_a_local_config_is_refused() -> None:
    with pytest.raises(PlanError, match="model_path"):
        request_from_sglang(server_args(model_path=None), MEMORY)
    with pytest.raises((PlanError, OSError)):
        request_from_sglang(server_args(model_path="/nonexistent/model"), MEMORY)
