"""A pytest plugin that `vllm_own_tests.py` loads into a run of vLLM's own tests (`-p
vllm_probe_plugin`): it records, per test, its outcome and which KV cache config builders it
called, and with HISPARSE_PROBE_MODE=ours installs hisparse_plan's builder through vLLM's
platform hook before every test (a test that patches the hook itself still wins).

With HISPARSE_PROBE_TRITON=1, vLLM 0.34's CPU platform sees Triton while it checks a config
(`CpuPlatform.check_and_update_config` refuses x86 without it; planning runs no Triton).

Results go to HISPARSE_PROBE_OUT as JSON lines: one header line (the vLLM imported, the mode),
then one line per test: nodeid, outcome, the builder calls by kind (`ours`, `default`, `other`),
and the failure's last error lines.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

MODE = os.environ.get("HISPARSE_PROBE_MODE", "stock")
OUT = Path(os.environ.get("HISPARSE_PROBE_OUT", "vllm_probe.jsonl"))
OURS = "HisparsePlanKVCacheConfigBuilder"
HOOKS = ("get_kv_cache_groups", "get_kv_cache_config_from_groups", "_get_pool_bytes_per_block")

_calls: Counter[str] = Counter()
_results: dict[str, dict[str, Any]] = {}


def _kind(builder: object) -> str:
    name = type(builder).__name__
    if name == OURS:
        return "ours"
    return "default" if name == "DefaultKVCacheConfigBuilder" else "other"


def _recording(method: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(method)
    def record(self: object, *args: object, **kwargs: object) -> object:
        _calls[_kind(self)] += 1
        return method(self, *args, **kwargs)

    return record


def _record_every_builder() -> None:
    """Wrap the hooks of the builder interface itself, so every subclass that inherits or
    overrides them (vLLM's default, ours, a test's own) is counted: overriding methods are
    wrapped as their classes are defined (`__init_subclass__`)."""
    interface = importlib.import_module("vllm.v1.core.kv_cache_config_builder")
    base = interface.KVCacheConfigBuilder

    def wrap_class(cls: type) -> None:
        for hook in HOOKS:
            method = cls.__dict__.get(hook)
            if method is not None and not getattr(method, "_probe", False):
                wrapped = _recording(method)
                wrapped._probe = True  # type: ignore[attr-defined]
                setattr(cls, hook, wrapped)

    def subclasses(cls: type) -> Iterator[type]:
        sub: type
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    original = base.__dict__.get("__init_subclass__")

    def init_subclass(cls: type, /, **kwargs: object) -> None:
        if original is not None:
            original.__func__(cls, **kwargs)
        wrap_class(cls)

    base.__init_subclass__ = classmethod(init_subclass)
    importlib.import_module("vllm.v1.core.kv_cache_planning")
    importlib.import_module("hisparse_plan.adapters.vllm.builder")
    for cls in [base, *subclasses(base)]:
        wrap_class(cls)


def _satisfy_triton_check() -> None:
    cpu = importlib.import_module("vllm.platforms.cpu").CpuPlatform
    triton_utils: Any = importlib.import_module("vllm.triton_utils")
    check = cpu.check_and_update_config.__func__

    def checked(cls: type, vllm_config: object) -> None:
        saved = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    cpu.check_and_update_config = classmethod(checked)


def _record_resolutions() -> None:
    """Count the builders vLLM resolves through its platform hook (`resolved_ours`,
    `resolved_other`), apart from builders a test constructs itself."""
    interface: Any = importlib.import_module("vllm.v1.core.kv_cache_config_builder")
    planning: Any = importlib.import_module("vllm.v1.core.kv_cache_planning")
    resolve = interface.get_kv_cache_config_builder

    @functools.wraps(resolve)
    def resolving(vllm_config: object) -> object:
        builder = resolve(vllm_config)
        _calls["resolved_ours" if _kind(builder) == "ours" else "resolved_other"] += 1
        return builder

    interface.get_kv_cache_config_builder = resolving
    if hasattr(planning, "get_kv_cache_config_builder"):  # 0.34 imports the name at the top
        planning.get_kv_cache_config_builder = resolving


def pytest_configure(config: pytest.Config) -> None:
    del config
    vllm = importlib.import_module("vllm")
    if os.environ.get("HISPARSE_PROBE_TRITON") == "1":
        _satisfy_triton_check()
    _record_every_builder()
    _record_resolutions()
    OUT.write_text(json.dumps({"vllm": vllm.__version__, "vllm_file": vllm.__file__,
                               "mode": MODE}) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    del item
    _calls.clear()
    if MODE == "ours":
        importlib.import_module("hisparse_plan.adapters.vllm").install_builder()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "error": ""})
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        text = str(report.longrepr)
        lines = [line for line in text.splitlines() if line.startswith("E ")]
        entry["error"] = "\n".join(lines[-6:]) or text[-600:]
    elif report.skipped and report.when != "teardown":
        entry["outcome"] = "skipped"
    if report.when == "teardown":
        entry["calls"] = dict(_calls)
        with OUT.open("a") as out:
            out.write(json.dumps({"nodeid": report.nodeid, **entry}) + "\n")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        error = str(report.longrepr).splitlines()[-1:]
        with OUT.open("a") as out:
            out.write(json.dumps({"nodeid": report.nodeid, "outcome": "collection_error",
                                  "error": "\n".join(error), "calls": {}}) + "\n")
