"""Exchanging layouts between instances: the layout fingerprint, a transfer manifest, the
compatibility of two plans, transfer programs (`transfer/`). May import models, views, checking."""

from hisparse_plan.exchange.compat import LAYOUT_FIELDS, TransferCompatibility, diff
from hisparse_plan.exchange.manifest import (
    LayerEntry,
    MemoryRegion,
    TransferManifest,
    manifest,
)
from hisparse_plan.models.fingerprint import canonical_json, fingerprint, layout_document

__all__ = [
    "LAYOUT_FIELDS",
    "LayerEntry",
    "MemoryRegion",
    "TransferCompatibility",
    "TransferManifest",
    "canonical_json",
    "diff",
    "fingerprint",
    "layout_document",
    "manifest",
]
