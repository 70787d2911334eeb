"""Speculative decoding by MTP: which draft layers join the plan, and the lookahead vLLM keeps.

With `speculative="mtp"` the model's `num_nextn_predict_layers` draft layers get KV caches of
their own. `num_speculative_tokens` (K) defaults to the number of MTP layers, as in vLLM,
which reuses the layers in turn when K is larger. vLLM 0.33's `num_prefill_lookahead_tokens`
is K when more than one MTP module is chained (min(layers, K) > 1), else 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.settings import Settings


@dataclass(frozen=True, slots=True)
class MTPPlan:
    layers: int
    """Draft layers that join the plan (0 without MTP)."""
    tokens: int | None
    """Speculative tokens per step (None: as the settings say)."""
    lookahead: int
    """scheduler.num_prefill_lookahead_tokens."""


def mtp_plan(settings: Settings, num_nextn_predict_layers: int) -> MTPPlan:
    if settings.speculative is None:
        return MTPPlan(0, settings.spec_tokens, 0)
    if num_nextn_predict_layers == 0:
        raise ConfigError(
            "speculative: MTP needs draft layers, but the model's num_nextn_predict_layers is 0",
            field="speculative",
        )
    if (settings.pp or 1) > 1:
        raise ConfigError(
            "speculative: MTP with pipeline stages is not planned (the draft layers' stage is "
            "not modelled); expected --pp 1",
            field="speculative",
        )
    tokens = settings.spec_tokens or num_nextn_predict_layers
    lookahead = tokens if min(num_nextn_predict_layers, tokens) > 1 else 1
    return MTPPlan(num_nextn_predict_layers, tokens, lookahead)
