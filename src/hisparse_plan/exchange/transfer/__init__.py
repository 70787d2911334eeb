"""The transfer between two plans (docs/transfer.md): a pattern proved once and instantiated
per request, or one request's program built and proved. May import models, views, checking.

compile_transfer + check_pattern once per pair of instances, TransferPattern.instantiate per
request; build_transfer + check_transfer are the reference. Executors post either. Where the
pattern's copies are small, compile_staged + check_staged move each block whole into a staging
region and rearrange it there; `choose` says which way is cheaper for a link.
"""

from hisparse_plan.exchange.transfer.build import build_transfer
from hisparse_plan.exchange.transfer.check import TransferProof, check_transfer
from hisparse_plan.exchange.transfer.check_pattern import PatternProof, check_pattern
from hisparse_plan.exchange.transfer.check_staged import StagedProof, check_staged
from hisparse_plan.exchange.transfer.compile import compile_transfer
from hisparse_plan.exchange.transfer.cost import GPU_LINK, LOOPBACK, Choice, LinkCosts, choose
from hisparse_plan.exchange.transfer.errors import TransferCheckError, TransferRefused
from hisparse_plan.exchange.transfer.pattern import TransferPattern
from hisparse_plan.exchange.transfer.program import (
    RankRegions,
    Region,
    TransferProgram,
    TransferRequest,
    TransferRow,
)
from hisparse_plan.exchange.transfer.side import Instance
from hisparse_plan.exchange.transfer.staging import Slab, StagedPattern, compile_staged
from hisparse_plan.exchange.transfer.tables import tables

__all__ = [
    "GPU_LINK",
    "LOOPBACK",
    "Choice",
    "Instance",
    "LinkCosts",
    "PatternProof",
    "RankRegions",
    "Region",
    "Slab",
    "StagedPattern",
    "StagedProof",
    "TransferCheckError",
    "TransferPattern",
    "TransferProgram",
    "TransferProof",
    "TransferRefused",
    "TransferRequest",
    "TransferRow",
    "build_transfer",
    "check_pattern",
    "check_staged",
    "check_transfer",
    "choose",
    "compile_staged",
    "compile_transfer",
    "tables",
]
