"""vLLM 0.34's own `KVConnectorFactory` loads `HisparsePlanConnector` by module path (the
`--kv-transfer-config` a user writes), and the class is `SupportsHMA` (else vLLM switches
the hybrid manager off, or refuses: `factory.py::create_connector`). Runs where vLLM imports
(the vLLM venv; CI runs it there)."""

from __future__ import annotations

import importlib
import os

import pytest

if os.environ.get("CI", "").lower() != "true":  # CI installs vLLM: a failure there
    pytest.importorskip("vllm")

MODULE = "hisparse_plan.connectors.vllm"


def config(**extra: object) -> object:
    kv_transfer = importlib.import_module("vllm.config.kv_transfer")
    return kv_transfer.KVTransferConfig(kv_connector="HisparsePlanConnector",
                                        kv_connector_module_path=MODULE, kv_role="kv_both",
                                        **extra)


def test_vllms_factory_loads_the_class_by_module_path() -> None:
    factory = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
    base = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
    found = factory.KVConnectorFactory.get_connector_class(config())
    assert found.__name__ == "HisparsePlanConnector"
    assert found.__module__ == f"{MODULE}.connector"
    assert issubclass(found, base.KVConnectorBase_V1)
    assert base.supports_hma(found)
    assert factory.KVConnectorFactory.supports_hma_config(config())


def test_the_class_answers_what_vllm_asks_before_making_one() -> None:
    factory = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
    found = factory.KVConnectorFactory.get_connector_class(config())
    access = importlib.import_module("vllm.config.kv_transfer").KVCacheAccess
    assert found.get_required_kvcache_layout(None) is None  # any layout: the plan says
    assert found.kv_cache_access(config()) == access.REGISTERS


def test_a_wrong_class_name_is_vllms_error() -> None:
    factory = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
    kv_transfer = importlib.import_module("vllm.config.kv_transfer")
    wrong = kv_transfer.KVTransferConfig(kv_connector="NoSuchConnector",
                                         kv_connector_module_path=MODULE, kv_role="kv_both")
    with pytest.raises((AttributeError, ValueError)):
        factory.KVConnectorFactory.get_connector_class(wrong)
