"""The transfer between two plans (docs/transfer.md): a pattern proved once and instantiated
per request, or one request's program built and proved. May import models, views, checking.

Its rooms, each importing only those before it (and errors.py, which all share): `facts/`
(what each engine's plan offers, where its bytes lie), `program/` (one request's rows and how
they are built), `proof/` (check_transfer), `pattern/` (the pattern, its instantiation, the
staged pattern, the cost model) and `executors/` (reference, numpy rearrangement, NIXL direct,
prepared and staged; they import numpy or NIXL, so import them from `executors` yourself).

compile_transfer + check_pattern once per pair of instances, TransferPattern.instantiate per
request; build_transfer + check_transfer are the reference. Where the pattern's copies are
small, compile_staged + check_staged move each block whole into a staging region and rearrange
it there; `choose` says which way is cheaper for a link.
"""

from hisparse_plan.exchange.transfer.errors import TransferCheckError, TransferRefused
from hisparse_plan.exchange.transfer.facts.side import Instance
from hisparse_plan.exchange.transfer.facts.tables import tables
from hisparse_plan.exchange.transfer.pattern.check_pattern import PatternProof, check_pattern
from hisparse_plan.exchange.transfer.pattern.check_staged import StagedProof, check_staged
from hisparse_plan.exchange.transfer.pattern.compile import compile_transfer
from hisparse_plan.exchange.transfer.pattern.cost import (
    GPU_LINK,
    LOOPBACK,
    Choice,
    LinkCosts,
    choose,
)
from hisparse_plan.exchange.transfer.pattern.parts import Slab
from hisparse_plan.exchange.transfer.pattern.staging import StagedPattern, compile_staged
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.build import build_transfer
from hisparse_plan.exchange.transfer.program.transfer_program import (
    RankRegions,
    Region,
    TransferProgram,
    TransferRequest,
    TransferRow,
)
from hisparse_plan.exchange.transfer.proof.check import TransferProof, check_transfer

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
