"""A transfer program between two plans (docs/transfer.md): built, proved by check_transfer, posted
by an executor (`reference.execute` in one process). May import models, views, checking.

A program is built from the source and destination instances' plans and a request's blocks.
"""

from hisparse_plan.exchange.transfer.build import build_transfer
from hisparse_plan.exchange.transfer.check import TransferProof, check_transfer
from hisparse_plan.exchange.transfer.errors import TransferCheckError, TransferRefused
from hisparse_plan.exchange.transfer.program import (
    RankRegions,
    Region,
    TransferProgram,
    TransferRequest,
    TransferRow,
)
from hisparse_plan.exchange.transfer.side import Instance
from hisparse_plan.exchange.transfer.tables import tables

__all__ = [
    "Instance",
    "RankRegions",
    "Region",
    "TransferCheckError",
    "TransferProgram",
    "TransferProof",
    "TransferRefused",
    "TransferRequest",
    "TransferRow",
    "build_transfer",
    "check_transfer",
    "tables",
]
