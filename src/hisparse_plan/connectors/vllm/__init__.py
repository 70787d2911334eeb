"""vLLM 0.34's KV connector over proved patterns: `HisparsePlanConnector` (imports vLLM when
it is asked for; `settings`, `scheduler` and `worker` import no vLLM)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:  # noqa: ANN401
    """vLLM's factory does `getattr(import_module(path), "HisparsePlanConnector")`."""
    if name in ("HisparsePlanConnector", "PlanHandshake", "PlanMeta"):
        from hisparse_plan.connectors.vllm import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
