"""The defaults SGLang 0.5.23 picks by the GPU's compute capability, resolve-stage rules
(resolve.py), one function each: a DSA model's kv cache dtype under `auto`, its prefill and
decode DSA backends, and the page the default attention backend forces on Blackwell (SM100).
Read from arg_groups/overrides.py (`_dsa_kv_cache_dtype`, `_dsa_split_backend_resolution`,
`_attention_backend_default`, `_mla_backend_page_constraints`), model_override_base.py
(`get_default_attn_backend`) and model_overrides/deepseek_v2.py."""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import SGLangModel
from hisparse_plan.targets.sglang.modes.dcp import dcp_dsa_backends

HOPPER: Final = (9, 0)
"""The capability assumed when the request names none (the project's H200 default)."""
DEEPSEEK_FAMILY: Final = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
    "Glm5NextForConditionalGeneration", "HYV4ForCausalLM", "HYV4ForCausalLMNextN",
    "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM",
})
"""`_deepseek_family_overrides`' architectures: on SM100 their MLA runs trtllm_mla."""
TRTLLM_MLA_PAGES: Final = frozenset({32, 64})
TRTLLM_MHA_PAGES: Final = frozenset({16, 32, 64, 128})
TRTLLM_PAGE: Final = 64
"""The page `_mla_backend_page_constraints` moves any other page to."""


def capability(settings: SGLangSettings) -> tuple[int, int]:
    """The GPU's (major, minor) compute capability; Hopper's when none is given."""
    given = settings.compute_capability
    return HOPPER if given is None else (given[0], given[1])


def is_dsa(model: SGLangModel) -> bool:
    return model.latent is not None and model.latent.is_dsa


def dsa_kv_cache_dtype(settings: SGLangSettings, model: SGLangModel) -> str:
    """`--kv-cache-dtype auto` on a DSA model: fp8_e4m3 from compute capability 10 on,
    bfloat16 before; any other setting (and any other model) kept."""
    if settings.kv_cache_dtype != "auto" or not is_dsa(model):
        return settings.kv_cache_dtype
    return "fp8_e4m3" if capability(settings)[0] >= 10 else "bfloat16"


def dsa_backends(settings: SGLangSettings, kv_cache_dtype: str) -> tuple[str, str]:
    """(prefill, decode) DSA backends: the given one for both; under decode context
    parallelism trtllm for both (dcp_dsa_backends); with HiSparse flashmla_kv (fp8)
    or flashmla_sparse; an fp8 cache trtllm from capability 10 on, else flashmla_kv (GLM-5 fp8
    on SM12x: flashinfer_sparse_mla); a bfloat16 cache flashmla_sparse to prefill, trtllm
    (capability 10 on) or fa3 to decode."""
    if settings.dsa_backend is not None:
        return settings.dsa_backend, settings.dsa_backend
    dcp = dcp_dsa_backends(settings)
    if dcp is not None:
        return dcp
    major = capability(settings)[0]
    fp8 = kv_cache_dtype == "fp8_e4m3"
    if major == 12 and fp8 and settings.architecture == "GlmMoeDsaForCausalLM":
        return "flashinfer_sparse_mla", "flashinfer_sparse_mla"
    if settings.enable_hisparse:
        backend = "flashmla_kv" if fp8 else "flashmla_sparse"
        return backend, backend
    if fp8:
        backend = "trtllm" if major >= 10 else "flashmla_kv"
        return backend, backend
    return "flashmla_sparse", "trtllm" if major >= 10 else "fa3"


def raw_latent_row(backends: tuple[str, str]) -> bool:
    """`calculate_mla_kv_cache_dim`: trtllm on either side, or tilelang on both, reads the raw
    kv_lora_rank + rope row; any other pair the packed fp8 row."""
    return "trtllm" in backends or backends == ("tilelang", "tilelang")


def platform_defaults(
    settings: SGLangSettings, model: SGLangModel, page: int
) -> list[tuple[str, object, str]]:
    """The defaults the GPU's capability decided, as (subject, value, why), for the trace and
    the CLI: a DSA model's kv dtype under auto and its backends, and a page Blackwell's
    trtllm backends moved."""
    major, minor = capability(settings)
    given = "" if settings.compute_capability is not None else ", assumed (none given)"
    out: list[tuple[str, object, str]] = [
        ("compute capability", f"{major}.{minor}", f"SM{major}{minor}{given}")]
    if is_dsa(model):
        kv = dsa_kv_cache_dtype(settings, model)
        if settings.kv_cache_dtype == "auto":
            out.append(("kv_cache_dtype", kv, f"auto on a DSA model at SM{major}x: "
                        + ("fp8 from Blackwell on" if kv == "fp8_e4m3" else "bfloat16 before "
                           "Blackwell")))
        prefill, decode = dsa_backends(settings, kv)
        rows = "raw kv_lora_rank + rope rows" if raw_latent_row((prefill, decode)) or (
            kv != "fp8_e4m3") else "packed fp8 rows (nope, scales, bf16 rope)"
        out.append(("dsa backends", f"{prefill}/{decode}", (
            "given" if settings.dsa_backend is not None else
            "decode context parallelism's" if settings.dcp_size > 1 else "SGLang's default for "
            + ("HiSparse" if settings.enable_hisparse else f"{kv} at SM{major}x"))
            + f": {rows}"))
    moved = blackwell_page(settings, model, page)
    if moved != page:
        out.append(("page_size", moved, f"SM100's default trtllm attention backend takes no "
                    f"page of {page}"))
    return out


def blackwell_mla(settings: SGLangSettings, model: SGLangModel) -> bool:
    """A DeepSeek-family MLA model (not DSA) on SM100: SGLang runs trtllm_mla."""
    return (capability(settings)[0] == 10 and model.latent is not None and not is_dsa(model)
            and settings.architecture in DEEPSEEK_FAMILY)


def blackwell_page(settings: SGLangSettings, model: SGLangModel, page: int) -> int:
    """The page after SM100's default attention backend: a DeepSeek-family MLA model runs
    trtllm_mla (pages 32 or 64, else 64), an MHA model trtllm_mha (16, 32, 64 or 128, else
    64) unless its K and V rows differ (fa4) or it keeps Mamba states (SGLang picks triton
    for the hybrid linear models). DSA models keep their own page; other GPUs any page."""
    if capability(settings)[0] != 10 or is_dsa(model) or model.mamba is not None:
        return page
    if model.latent is not None:
        if settings.architecture not in DEEPSEEK_FAMILY:
            return page
        allowed = TRTLLM_MLA_PAGES
    else:
        groups = [g for g in (model.full, model.swa) if g is not None]
        if any(g.head_dim != g.v_head_dim for g in groups):
            return page
        allowed = TRTLLM_MHA_PAGES
    return page if page in allowed else TRTLLM_PAGE
