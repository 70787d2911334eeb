"""The connectors' refusals: each a `PlanError` naming what it refuses, expected and got."""

from __future__ import annotations

from hisparse_plan.errors import PlanError


class ConnectorError(PlanError):
    """A connector refuses: a hostile payload or ticket, live memory unlike its plan, a peer
    whose pattern is refused, a transport fault."""


class BindingError(ConnectorError):
    """The memory an engine hands the connector is not what the plan places: `layer` names the
    layer (or None for a config-wide field)."""

    def __init__(self, message: str, *, field: str | None = None,
                 layer: str | None = None) -> None:
        super().__init__(message, field=field)
        self.layer = layer
