"""DeepSeek-V4 in SGLang 0.5.23's pipeline stages, the rules beyond every model's
(modes/pipeline_stages.py), one a function: a rank sizes and builds its V4 pools for its own decoder
layers (DSV4PoolConfigurator's stage slice, DeepSeekV4TokenToKVPool's start_layer/end_layer), and
then

- keeps an empty pool (no buffer) for each compression ratio of the model its layers lack
  (`_init_compressed_pools`: one pool a ratio of the whole model's `compress_ratios`, so that
  the PD transfer's pool order is the same on every rank), with the slot count of the pool it
  would have had;
- with HiSparse, needs a ratio-4 layer: HiSparseCoordinator reads the c4 device pool's padded
  page bytes, which a pool without layers never sets (`bytes_per_page_padded` is set while its
  first buffer is created), so such a rank fails and the deployment with it."""

from __future__ import annotations

from typing import Final

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.layer_specs import MLASpec
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import V4EmptyPool
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.deepseek_v4.model import V4_VERSION, V4Model
from hisparse_plan.targets.sglang.modes.pipeline_stages import Stage

RATIO_POOLS: Final[dict[int, tuple[V4EmptyPool, ...]]] = {4: ("v4_c4", "v4_index_c4"),
                                                          128: ("v4_c128",)}
"""The pools SGLang keeps a compression ratio in (its compressor states are per layer: a rank
without the ratio has none)."""


def model_ratios(request: PlanRequest) -> frozenset[int]:
    """The compression ratios of the whole model's compressed latent caches (every rank's)."""
    return frozenset(spec.compress_ratio for spec in request.layers.values()
                     if isinstance(spec, MLASpec) and spec.model_version == V4_VERSION)


def empty_pools(ratios: frozenset[int], model: V4Model) -> tuple[V4EmptyPool, ...]:
    """The pools the rank keeps without a buffer: those of the model's ratios that none of
    the rank's layers compresses by (none without stages, where the rank has every layer)."""
    return tuple(name for ratio, names in RATIO_POOLS.items()
                 if ratio in ratios and not model.num_layers(ratio) for name in names)


def refuse_hisparse_without_c4(
    settings: SGLangSettings, model: V4Model, stage: Stage | None
) -> None:
    """HiSparse on a rank whose layers have no ratio-4 layer is refused naming the rank: its
    HiSparseCoordinator fails on the empty c4 pool (module doc)."""
    if stage is None or not settings.enable_hisparse or model.num_layers(4):
        return
    raise UnsupportedRequestError(
        f"engine.enable_hisparse: pipeline rank {stage.rank} keeps decoder layers "
        f"[{stage.start}, {stage.end}), none of them compressed by 4, and SGLang's HiSparse "
        "coordinator fails on that rank's empty c4 pool (it reads the pool's page bytes, "
        "which a pool without layers never sets); expected every rank to keep a ratio-4 "
        f"layer (other stages than {stage.size}) or HiSparse off",
        field="engine.enable_hisparse",
    )
