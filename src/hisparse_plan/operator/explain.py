"""Every number of a plan, with the rule and the inputs it came from.

The stages of the request's target (vLLM's, SGLang's) record what they decided and why
(`plan_traced`); an explanation renders that record, section by stage under the target's own
titles, so it can never disagree with the plan. For a preset or a config.json, a first section
derives the layer rows from the model's config fields.
"""

from __future__ import annotations

from hisparse_plan.models import PlanRequest
from hisparse_plan.models.base import Model
from hisparse_plan.models.layer_specs import KVLayerSpec, MambaSpec
from hisparse_plan.presets import (
    Architecture,
    KVDtype,
    ModelArchitecture,
    RegularArchitecture,
    row_geometry,
)
from hisparse_plan.presets.kv_dtypes import FP8_TILE, SCALE_BYTES
from hisparse_plan.rule_docs import rule_doc
from hisparse_plan.targets.registry import engine_name, target
from hisparse_plan.targets.trace import Decision

Number = int | float
Value = int | float | str
Inputs = dict[str, int | float | str]


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
    architecture: Architecture | None = None,
    kv_dtype: KVDtype | None = None,
) -> Explanation:
    """Plan `request` with its engine's target and explain every decision of the plan.

    With the `architecture` (and `kv_dtype`) the request was built from, a first section
    ("model config") derives the layer geometry from the model's config.json fields, for a
    sparse-MLA model and a regular one alike.
    """
    planner = target(engine_name(request))
    traced = planner.plan_traced(request)
    titles = planner.STAGE_TITLES
    sections = []
    if isinstance(architecture, ModelArchitecture):
        sections.append(_config_section(request, architecture, kv_dtype or "fp8_ds_mla"))
    elif architecture is not None:
        sections.append(_regular_config_section(request, architecture))
    by_stage: dict[str, list[Step]] = {stage: [] for stage in titles}
    for decision in traced.trace.decisions:
        by_stage.setdefault(decision.stage, []).append(_decision_step(decision))
    sections += [
        Section(title=titles.get(stage, stage), steps=steps)
        for stage, steps in by_stage.items()
        if steps
    ]
    return Explanation(sections=sections)


def _decision_step(decision: Decision) -> Step:
    value = decision.value
    shown: Value = value if isinstance(value, int | float | str) else str(value)
    formula = f"{decision.why} (see {rule_doc(decision.rule)})"
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




def _regular_config_section(request: PlanRequest, arch: RegularArchitecture) -> Section:
    """A regular model's config fields and what they make: layers by kind, the KV row of one
    token and the page of one block (from the request's first attention layer), a Mamba
    state, and the context."""
    kinds = arch.layer_kinds()
    counts = ", ".join(f"{kinds.count(kind)} {kind}" for kind in dict.fromkeys(kinds))
    steps = [
        Step(name="layers", value=len(kinds), formula=f"num_hidden_layers: {counts}",
             inputs={"num_hidden_layers": arch.num_hidden_layers}),
    ]
    attention = next((s for s in request.layers.values() if isinstance(s, KVLayerSpec)), None)
    if attention is not None:
        dtype_bytes = attention.page_size_bytes // (
            attention.block_size * 2 * attention.num_kv_heads * attention.head_size
        )
        steps += [
            _step("kv heads per rank", attention.num_kv_heads,
                  "num_key_value_heads / tp (one, replicated, when tp exceeds them)",
                  num_key_value_heads=arch.kv_heads),
            _step("head_size", attention.head_size,
                  "head_dim, else hidden_size / num_attention_heads",
                  hidden_size=arch.hidden_size, num_attention_heads=arch.attention_heads),
            _step(f"token bytes ({attention.dtype})", 2 * attention.num_kv_heads
                  * attention.head_size * dtype_bytes,
                  "2 (K and V) * kv heads * head_size * dtype bytes", dtype_bytes=dtype_bytes),
            _step("attention page bytes", attention.page_size_bytes,
                  "block_size * token bytes", block_size=attention.block_size),
        ]
    mamba = next((s for s in request.layers.values() if isinstance(s, MambaSpec)), None)
    if mamba is not None:
        steps.append(_step("mamba page bytes", mamba.page_size_bytes,
                           "conv + recurrent state bytes, padded to an attention page"))
    length = request.model.max_model_len
    steps.append(_step(
        "max_model_len", length,
        "max_position_embeddings" if length == arch.max_position_embeddings else "chosen",
        max_position_embeddings=arch.max_position_embeddings,
    ))
    return Section(title="model config (config.json fields)", steps=steps)
