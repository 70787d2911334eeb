"""The layout fingerprint, as `hisparse_plan.exchange` offers it: computed in
`hisparse_plan.models.fingerprint`, beside the plan whose `fingerprint` property it is (models
import nothing from exchange)."""

from hisparse_plan.models.fingerprint import (
    FINGERPRINT_VERSION,
    canonical_json,
    fingerprint,
    layout_document,
)

__all__ = ["FINGERPRINT_VERSION", "canonical_json", "fingerprint", "layout_document"]
