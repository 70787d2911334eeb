"""Why a transfer is refused (before any byte moves) or a program is not proved."""

from __future__ import annotations

from hisparse_plan.errors import PlanError


class TransferRefused(PlanError):
    """The two plans cannot exchange this request's KV as bytes: `layer` and `what` name the
    first difference, `source` and `destination` hold each side's value (see
    docs/transfer.md#what-is-refused)."""

    def __init__(
        self,
        message: str,
        *,
        layer: str | None = None,
        what: str | None = None,
        source: object = None,
        destination: object = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message, field=field)
        self.layer = layer
        self.what = what
        self.source = source
        self.destination = destination


def refuse_difference(layer: str, what: str, source: object, destination: object,
                      why: str) -> TransferRefused:
    """The refusal for a layer whose `what` differs between the sides."""
    return TransferRefused(
        f"layer {layer!r}: {what} differs: the source has {source}, the destination has "
        f"{destination}; {why} (see docs/transfer.md#what-is-refused)",
        layer=layer, what=what, source=source, destination=destination,
        field=f"layers[{layer!r}].{what}",
    )


class TransferCheckError(PlanError):
    """check_transfer could not prove a program: `row` is the index of the first row at fault
    (None when the fault is a byte no row moves)."""

    def __init__(self, message: str, *, row: int | None = None, layer: str | None = None
                 ) -> None:
        super().__init__(message, field=None if row is None else f"rows[{row}]")
        self.row = row
        self.layer = layer
