"""The connector's settings (`kv_connector_extra_config`) and the plan it runs on; imports
no vLLM (it reads vLLM's objects by attribute)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final, Literal

from hisparse_plan.adapters.vllm import request_from_vllm
from hisparse_plan.connectors.errors import ConnectorError
from hisparse_plan.connectors.protocol import InstanceFacts
from hisparse_plan.connectors.vllm.binding import live_layer_specs, plan_for_live_config
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.untrusted_json import read_json_file

PORT_ENV: Final = "HISPARSE_PLAN_SIDE_CHANNEL_PORT"
DEFAULT_PORT: Final = 5610
TICKET_KEY: Final = "hisparse_plan_ticket"
"""The key of the ticket in `kv_transfer_params`."""
KNOWN: Final = frozenset({"plan_request", "instance_id", "side_channel_host",
                          "side_channel_port", "transfer_mode", "lease_s", "facts"})


@dataclass(frozen=True)
class Settings:
    instance_id: str
    side_channel_host: str
    side_channel_port: int
    transfer_mode: Literal["pull", "push"]
    lease_s: float
    plan_request: str | None
    facts: InstanceFacts

    @property
    def side_channel(self) -> str:
        return f"{self.side_channel_host}:{self.side_channel_port}"


def settings_of(vllm_config: Any) -> Settings:  # noqa: ANN401
    """The connector's settings from `kv_transfer_config.kv_connector_extra_config`:
    `plan_request` (a plan request JSON file; default: the request vLLM's own objects give),
    `instance_id` (default the engine id), `side_channel_host` (loopback), `side_channel_port`
    (default $HISPARSE_PLAN_SIDE_CHANNEL_PORT or 5610), `transfer_mode` (`pull`, the
    default), `lease_s` (30), `facts` (`InstanceFacts`: total_kv_heads, cache_dtype, ...)."""
    transfer = vllm_config.kv_transfer_config
    extra = dict(getattr(transfer, "kv_connector_extra_config", None) or {})
    unknown = sorted(set(extra) - KNOWN)
    if unknown:
        raise ConnectorError(f"kv_connector_extra_config: unknown keys {unknown}; expected "
                             f"some of {sorted(KNOWN)}", field="kv_connector_extra_config")
    mode = extra.get("transfer_mode", "pull")
    if mode != "pull":
        raise ConnectorError(f"transfer_mode: {mode!r}; this version pulls (the decode READs, "
                             "vLLM's default); push is not built yet (docs/connector.md)",
                             field="transfer_mode")
    port = extra.get("side_channel_port", int(os.environ.get(PORT_ENV, DEFAULT_PORT)))
    lease = extra.get("lease_s", 30.0)
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise ConnectorError(f"side_channel_port: {port!r}; expected a TCP port",
                             field="side_channel_port")
    if not isinstance(lease, int | float) or not 0 < lease <= 3600:
        raise ConnectorError(f"lease_s: {lease!r}; expected seconds in (0, 3600]",
                             field="lease_s")
    return Settings(
        instance_id=str(extra.get("instance_id") or getattr(transfer, "engine_id", "vllm")),
        side_channel_host=str(extra.get("side_channel_host", "127.0.0.1")),
        side_channel_port=port, transfer_mode="pull", lease_s=float(lease),
        plan_request=extra.get("plan_request"),
        facts=InstanceFacts.model_validate(extra.get("facts") or {}))


def live_plan(vllm_config: Any, kv_cache_config: Any, settings: Settings  # noqa: ANN401
              ) -> KVCachePlan:
    """The plan of the live config: the given request's (or the one vLLM's objects give),
    planned for the config's num_blocks and checked equal to it (binding)."""
    if settings.plan_request is not None:
        request = PlanRequest.model_validate(read_json_file(
            settings.plan_request, what="plan request", label="plan_request"))
    else:
        request = request_from_vllm(live_layer_specs(kv_cache_config), vllm_config,
                                    available_bytes=2**50)
    tp = getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", None)
    return plan_for_live_config(request, kv_cache_config, tensor_parallel_size=tp)
