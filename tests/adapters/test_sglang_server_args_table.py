"""SGLang 0.5.23's ServerArgs as data (adapters/sglang/server_args_table.py): the table equals
SGLang's own fields (enumerated in the SGLang venv when there is one, else held to a pinned
count and digest of its names), and a case's server_args is read by it: modelled fields taken,
memory-moving fields the plan does not model refused unless at SGLang's default, the others
accepted and ignored, and only names ServerArgs lacks refused, naming them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import request_from_server_args
from hisparse_plan.adapters.sglang.request import MODELLED, settings_from_server_args
from hisparse_plan.adapters.sglang.server_args_table import (
    CASE_KEYS,
    SERVER_ARGS_FIELDS,
    UNPLANNED,
)
from hisparse_plan.errors import PlanError, UnsupportedRequestError
from support import paths

REPO = paths.REPO
SGLANG_PYTHON = Path(os.environ.get("SGLANG_PYTHON", "/work/sglang/bin/python"))
GPT_OSS = REPO / "tests" / "hf_configs" / "gpt-oss-120b" / "config.json"
MEMORY = {"available_bytes": 8 << 30}
FIELD_COUNT = 546
"""ServerArgs' fields in SGLang 0.5.23 (msgspec.structs.fields(ServerArgs))."""
NAMES_SHA256 = "3858c6e16c3c335b3bcc054559facfdfc6554981b29e516888fafbb9419a5985"
"""sha256 of the sorted names, one a line, as SGLang 0.5.23 enumerates them: the pinned
list, checked without SGLang."""


def _names_digest(names: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()


def test_the_table_holds_the_pinned_fields() -> None:
    assert len(SERVER_ARGS_FIELDS) == FIELD_COUNT
    assert _names_digest(list(SERVER_ARGS_FIELDS)) == NAMES_SHA256
    # Fields the issue names, one of each class.
    assert {"disable_overlap_schedule", "page_size", "enable_hierarchical_cache",
            "log_level"} <= set(SERVER_ARGS_FIELDS)


@pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason="no SGLang venv here "
                    "($SGLANG_PYTHON or /work/sglang/bin/python)")
def test_the_table_equals_sglangs_own_server_args() -> None:
    """SGLang's interpreter enumerates ServerArgs (references/sglang_server_args_table.py
    --check): the same names, namespaces and defaults."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "references" / "sglang_stubs")}
    done = subprocess.run(
        [str(SGLANG_PYTHON), str(REPO / "references" / "sglang_server_args_table.py"),
         "--check"], capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_every_name_the_plan_reads_is_a_field_or_a_case_key() -> None:
    assert sorted(MODELLED - set(SERVER_ARGS_FIELDS)) == sorted(CASE_KEYS)
    assert set(UNPLANNED) <= set(SERVER_ARGS_FIELDS)
    assert not set(UNPLANNED) & MODELLED


def _request(**server_args: Any) -> Any:
    return request_from_server_args(GPT_OSS, {"tp_size": 1, "context_length": 4096,
                                              **server_args}, MEMORY)


def test_a_radix_off_gpt_oss_deployment_with_the_overlap_scheduler_off_is_planned() -> None:
    request = _request(disable_radix_cache=True, disable_overlap_schedule=True,
                       max_running_requests=8)
    assert request.engine.disable_overlap_schedule is True
    assert request.engine.disable_radix_cache is True


@pytest.mark.parametrize(("field", "value"), [
    ("log_level", "debug"), ("enable_metrics", True), ("schedule_policy", "lpm"),
    ("random_seed", 7), ("tokenizer_worker_num", 2), ("watchdog_timeout", 60.0),
])
def test_a_field_sglang_has_and_the_pools_do_not_read_is_ignored(field: str,
                                                                  value: Any) -> None:
    assert field in SERVER_ARGS_FIELDS
    assert field not in MODELLED
    assert field not in UNPLANNED
    assert _request(**{field: value}) == _request()


def test_a_name_sglang_does_not_have_is_refused_naming_it() -> None:
    with pytest.raises(PlanError, match=r"server_args\.disable_overlap_scheduler: not a field "
                       r"of SGLang 0\.5\.23's ServerArgs") as caught:
        settings_from_server_args({"disable_overlap_scheduler": True})
    assert caught.value.field == "server_args.disable_overlap_scheduler"


@pytest.mark.parametrize(("field", "value"), [
    ("enable_hierarchical_cache", True), ("attention_backend", "fa3"),
    ("cuda_graph_max_bs_decode", 64), ("disaggregation_mode", "decode"),
    ("device", "cpu"),
])
def test_a_field_that_moves_memory_the_plan_does_not_model_is_refused(field: str,
                                                                      value: Any) -> None:
    with pytest.raises(UnsupportedRequestError, match=f"server_args.{field}: ") as caught:
        settings_from_server_args({field: value})
    assert caught.value.field == f"server_args.{field}"
    assert repr(value) in str(caught.value)


@pytest.mark.parametrize(("field", "value"), [
    ("enable_hierarchical_cache", False), ("attention_backend", None),
    ("disaggregation_mode", "null"), ("device", "cuda"),
])
def test_an_unplanned_field_at_sglangs_default_is_accepted(field: str, value: Any) -> None:
    assert _request(**{field: value}) == _request()


@pytest.mark.parametrize(("given", "backend"), [
    ({"dsa_prefill_backend": "trtllm", "dsa_decode_backend": "trtllm"}, "trtllm"),
    ({"dsa_prefill_backend": "flashmla_kv", "dsa_decode_backend": "trtllm"}, "trtllm"),
    ({"dsa_backend": "tilelang"}, "tilelang"),
    ({"dsa_backend": "flashmla_kv", "dsa_decode_backend": "trtllm"}, "trtllm"),
])
def test_sglangs_dsa_backend_fields_are_the_dsa_backend(given: dict[str, str],
                                                        backend: str) -> None:
    assert settings_from_server_args({**given, "context_length": 4096}).dsa_backend == backend


def test_other_dsa_prefill_and_decode_backends_are_refused() -> None:
    with pytest.raises(UnsupportedRequestError) as caught:
        settings_from_server_args({"dsa_prefill_backend": "flashmla_sparse",
                                   "dsa_decode_backend": "flashmla_kv"})
    assert caught.value.field == "server_args.dsa_decode_backend"


def test_disable_cuda_graph_turns_both_graphs_off() -> None:
    settings = settings_from_server_args({"disable_cuda_graph": True, "context_length": 4096})
    assert settings.disable_decode_cuda_graph
    assert settings.disable_prefill_cuda_graph


def test_the_table_file_is_json_with_sglangs_version() -> None:
    path = REPO / "src" / "hisparse_plan" / "adapters" / "sglang" / "server_args_0_5_23.json"
    loaded = json.loads(path.read_text(encoding="utf-8"))
    assert loaded["sglang"] == "0.5.23"
    assert set(loaded["fields"]) == set(SERVER_ARGS_FIELDS)
