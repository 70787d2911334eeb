"""vLLM 0.34's own `KVConnectorFactory` loads `HisparsePlanConnector` by module path (the
`--kv-transfer-config` a user writes), and the class is `SupportsHMA` (else vLLM switches
the hybrid manager off, or refuses: `factory.py::create_connector`). Asked of a role process
(tests/connectors/conftest.py): it runs in the venv that has vLLM with the project installed."""

from __future__ import annotations

from support.connector_e2e_role import Servers, answer


def test_vllms_factory_loads_the_class_by_module_path(servers: Servers) -> None:
    servers["prefill"].send({"factory": True})
    found = answer(servers["prefill"], "prefill")
    assert found["name"] == "HisparsePlanConnector"
    assert found["module"] == "hisparse_plan.connectors.vllm.connector"
    assert found["is_v1_connector"]
    assert found["supports_hma"]
    assert found["supports_hma_config"]
    assert found["layout"] is None  # any layout: the plan says
    assert found["access"] == "REGISTERS"
    assert found["wrong_name"] is not None  # a class the module lacks is vLLM's error
