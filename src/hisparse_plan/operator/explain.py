"""Every number of a plan, with the rule and the inputs it came from.

The planner's stages record what they decided and why (`plan_traced`); an explanation renders
that record, section by stage, so it can never disagree with the plan. For a preset or a
config.json, a first section derives the layer rows from the model's config fields.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.models import PlanRequest
from hisparse_plan.models.base import Model
from hisparse_plan.planning import Decision, plan_traced
from hisparse_plan.presets import KVDtype, ModelArchitecture, row_geometry
from hisparse_plan.presets.kv_dtypes import FP8_TILE, SCALE_BYTES

Number = int | float
Value = int | float | str
Inputs = dict[str, int | float | str]
SECTION_TITLES: Final = {
    "pages": "pages (SPEC 5.1, 7.1)",
    "group": "groups (SPEC 5.2-5.6, 7.3)",
    "size": "pools: host and device (SPEC 5.7, 5.8, 7.4, 7.6)",
    "admit": "admission (SPEC 5.12, 7.7, 7.8)",
    "place": "tensors (SPEC 5.9, 7.5)",
    "report": "capacity (SPEC 5.10, 7.9)",
}
"""One section per planning stage, in the order the stages run."""


class Step(Model):
    """`name` = `formula` (over `inputs`) = `value`."""

    name: str
    value: Value
    formula: str
    inputs: Inputs


class Section(Model):
    title: str
    steps: list[Step]


class Explanation(Model):
    sections: list[Section]

    def step(self, name: str) -> Step:
        """The step called `name` (KeyError when there is none)."""
        for section in self.sections:
            for step in section.steps:
                if step.name == name:
                    return step
        raise KeyError(name)


def explain(
    request: PlanRequest,
    *,
    architecture: ModelArchitecture | None = None,
    kv_dtype: KVDtype | None = None,
) -> Explanation:
    """Plan `request` and explain every decision of the plan.

    With the `architecture` (and `kv_dtype`) the request was built from, a first section
    derives the layer geometry from the model's config.json fields.
    """
    traced = plan_traced(request)
    sections = []
    if architecture is not None:
        sections.append(_config_section(request, architecture, kv_dtype or "fp8_ds_mla"))
    by_stage: dict[str, list[Step]] = {stage: [] for stage in SECTION_TITLES}
    for decision in traced.trace.decisions:
        by_stage.setdefault(decision.stage, []).append(_decision_step(decision))
    sections += [
        Section(title=SECTION_TITLES.get(stage, stage), steps=steps)
        for stage, steps in by_stage.items()
        if steps
    ]
    return Explanation(sections=sections)


def _decision_step(decision: Decision) -> Step:
    value = decision.value
    shown: Value = value if isinstance(value, int | float | str) else str(value)
    formula = f"{decision.why} (SPEC {decision.rule})"
    return Step(name=decision.subject, value=shown, formula=formula, inputs={})


def _step(name: str, value: Number, formula: str, **inputs: int | float | str) -> Step:
    return Step(name=name, value=value, formula=formula, inputs=inputs)


def _config_section(request: PlanRequest, arch: ModelArchitecture, kv_dtype: KVDtype) -> Section:
    geometry = row_geometry(arch, kv_dtype)
    leaders = arch.leaders()
    if arch.sharing_source == "index_topk_freq":
        sharing = "layers i with max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0"
        sharing_inputs: Inputs = {
            "num_hidden_layers": arch.num_hidden_layers,
            "index_topk_freq": arch.index_topk_freq,
            "index_skip_topk_offset": arch.index_skip_topk_offset,
        }
    else:
        sharing = f"layers marked as running their own indexer in {arch.sharing_source}"
        sharing_inputs = {"num_hidden_layers": arch.num_hidden_layers}
    if kv_dtype == "fp8_ds_mla":
        row = _step(
            "sparse row bytes (fp8_ds_mla)", geometry.sparse_row_bytes,
            f"kv_lora_rank * 1 (fp8) + kv_lora_rank / {FP8_TILE} * {SCALE_BYTES} (float32 "
            "scales) + qk_rope_head_dim * 2 (bfloat16)",
            kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim,
        )
    else:
        row = _step(
            "sparse row bytes (bfloat16)", geometry.sparse_row_bytes,
            "(kv_lora_rank + qk_rope_head_dim) * 2",
            kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim,
        )
    indexer_row = _step(  # the indexer cache is fp8 whatever the latent rows are
        "indexer row bytes (fp8)", geometry.indexer_row_bytes,
        f"index_head_dim * 1 (fp8) + index_head_dim / {FP8_TILE} * {SCALE_BYTES} "
        "(float32 scales)",
        index_head_dim=arch.index_head_dim,
    )
    length = request.model.max_model_len
    if length == arch.max_position_embeddings:
        length_step = _step(
            "max_model_len", length, "max_position_embeddings",
            max_position_embeddings=arch.max_position_embeddings,
        )
    else:
        length_step = _step(
            "max_model_len", length, "chosen (below or above max_position_embeddings)",
            max_position_embeddings=arch.max_position_embeddings,
        )
    return Section(
        title="model config (config.json fields)",
        steps=[
            _step("sparse layers", len(leaders), "num_hidden_layers",
                  num_hidden_layers=arch.num_hidden_layers),
            Step(name="indexer layers", value=sum(leaders), formula=sharing,
                 inputs=sharing_inputs),
            _step("head_size", geometry.head_size, "kv_lora_rank + qk_rope_head_dim",
                  kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim),
            row,
            indexer_row,
            _step("index_topk", arch.index_topk, "index_topk", index_topk=arch.index_topk),
            length_step,
        ],
    )


