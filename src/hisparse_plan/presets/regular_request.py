"""A plan request for a regular model (no HiSparse), as vLLM runs it by default.

Layer names are vLLM's (`RegularArchitecture.layer_names`): by default
`model.layers.{i}.self_attn.attn` for attention layers, `model.layers.{i}.linear_attn` for
linear-attention layers, `model.layers.{i}.mixer` for Mamba layers and
`model.layers.{i}.short_conv` for short-convolution layers; a config.json reader sets the names
vLLM's code for the model's family gives (`families`).

Block sizes: the vLLM version's default for attention layers (16 tokens on 0.33, 64 on 0.34),
unless `block_size` is given. A hybrid model with linear-attention or Mamba layers gets the
block size and Mamba page padding that vLLM's config step (`Platform._align_hybrid_block_size`)
derives: with one token's attention page `t = 2 * kv_heads * head_size * 2` bytes and the Mamba
state page `m`, the attention block is `a * ceil(m / (a * t))` tokens, `a = max(16,
block_size)`, and the Mamba page is padded to `block * t` bytes. Beside MLA (Kimi-Linear) `t`
is one latent row and `a` at least 128.

With prefix caching (vLLM's default) a hybrid runs in Mamba align mode: the Mamba block is the
attention block. As on a Hopper GPU (FlashInfer's Gated DeltaNet prefill), a Gated DeltaNet
layer then exports one prefill checkpoint per request (`num_prefill_checkpoint_blocks` 1, on a
grid of one Mamba block), which makes `a` a multiple of 64 too; a Mamba-2 mixer always declares
one checkpoint block (vLLM's MambaMixer2); short-convolution and KDA layers export none. Without
prefix caching a Mamba layer's block_size is max_model_len (one state per request).

Cache dtype: bfloat16 by default; `fp8_e4m3` or `fp8_e5m2` (vLLM's `--kv-cache-dtype fp8`)
store one byte an element as `uint8`, as vLLM does, halving every attention page. Mamba
states keep their model dtypes (vLLM sizes them by the model dtype, not the KV-cache dtype), and
the hybrid block alignment above uses the fp8 attention page.
"""

from __future__ import annotations

import math
from typing import Any, Final

from hisparse_plan.models import DType, PlanRequest, dtype_size
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.kv_dtypes import REGULAR_DTYPES
from hisparse_plan.presets.regular import LayerKind, LayerNames, RegularArchitecture
from hisparse_plan.presets.settings import (
    DEFAULTS,
    Settings,
    context_length,
    default_block_size,
    device_section,
    model_section,
    scheduler_section,
)

STATEFUL: Final[frozenset[LayerKind]] = frozenset(
    {"linear", "mamba", "full_and_mamba", "sliding_and_mamba", "conv"})
ATTENTION_OF: Final[dict[LayerKind, LayerKind]] = {
    "full": "full", "sliding": "sliding", "chunked": "chunked", "mla": "mla",
    "full_and_mamba": "full", "sliding_and_mamba": "sliding", "full_and_cross": "full",
}
"""The attention cache a layer of each kind keeps beside its state, if any."""
MLA_BLOCK_SIZE: Final = 64
"""The block vLLM's default MLA backend on Hopper (FlashMLA) takes."""
MLA_HYBRID_BLOCK: Final = 128
"""vLLM's smallest block for an MLA model with state layers (`_align_hybrid_block_size`)."""
KERNEL_BLOCK: Final = 16
"""The smallest kernel block of vLLM's default (FlashAttention) backend."""
CHECKPOINT_ALIGNMENT: Final = 64
"""FlashInfer's Gated DeltaNet prefill emits checkpoints on multiples of 64 tokens."""
DTYPE: Final = "bfloat16"
"""The model dtype: what Mamba states hold, and attention caches unless fp8 is asked."""
FP8_STORAGE: Final[DType] = "uint8"
"""vLLM stores every fp8 KV-cache format as uint8 (its STR_DTYPE_TO_TORCH_DTYPE)."""
NOT_FOR_REGULAR: Final = {
    "host_pool_bytes": "a HiSparse host pool",
    "device_buffer_size": "a HiSparse hot buffer",
    "speculative": "MTP draft layers (planned for DeepSeek-style presets only)",
    "spec_tokens": "speculative decode rows (HiSparse's hot buffer)",
    "host_pool_layout": "a HiSparse host pool's placement",
}


def build_regular_request(arch: RegularArchitecture, settings: Settings) -> PlanRequest:
    kinds = arch.layer_kinds()
    refuse_unplannable(settings, REGULAR_DTYPES, "its layers are regular attention or plain MLA")
    cache_dtype: DType = (arch.auto_cache_dtype if settings.kv_dtype is None
                          else DTYPE if settings.kv_dtype == DTYPE else FP8_STORAGE)
    tp = settings.tp or 1
    max_model_len = (settings.max_model_len
                     if arch.length_assumed and settings.max_model_len is not None
                     else context_length(arch.max_position_embeddings, settings))
    mla = "mla" in kinds
    if arch.num_key_value_heads is None:
        return _attention_free_request(arch, kinds, tp, max_model_len, settings)
    attention = (_latent_row(arch, kinds, settings, cache_dtype) if mla
                 else _kv_rows(arch, tp, settings, cache_dtype))
    align_mode = settings.prefix_caching is not False
    states: dict[str, Any] | None = None
    if STATEFUL & set(kinds):
        token_bytes = attention["head_size"] * dtype_size(cache_dtype) * (1 if mla else 2) * (
            attention.get("num_kv_heads", 1))
        states, attention["block_size"] = _mamba_spec(
            arch, tp, token_bytes, attention["block_size"],
            None if align_mode else max_model_len, mla=mla,
        )
    names = arch.layer_names
    decoder_layers: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        caches: dict[str, Any] = {}
        if kind in ATTENTION_OF:
            base = ATTENTION_OF[kind]
            spec = attention if mla else _attention(arch, base, _own_heads(arch, i, attention,
                                                                           tp))
            target = (arch.kv_sharing or {}).get(i)
            if target is not None:
                spec = {**spec, "kv_sharing_target": names.name(names.attention, target,
                                                                len(kinds))}
            caches[names.name(names.attention, i, len(kinds))] = spec
        if kind == "full_and_cross":
            # The encoder's keys and values, of the decoder's self-attention geometry.
            caches[names.name(names.cross, i, len(kinds))] = {"kind": "cross_attention",
                                                               **attention}
        if kind in STATEFUL:
            template = {"linear": names.linear, "conv": names.conv}.get(kind, names.mamba)
            caches[names.name(template, i, len(kinds))] = states
            if names.state_first:
                caches = dict(reversed(caches.items()))
        decoder_layers.append(caches)
    if names.attention_slots:
        decoder_layers = _attention_first(decoder_layers, names, len(kinds), settings)
    request = regular_plan_request(
        decoder_layers, max_model_len, settings,
        mamba_cache_mode="align" if states is not None and align_mode else None,
        chunked_local="chunked" in kinds,
    )
    refuse_short_encoder_budget(arch, request.scheduler.max_num_batched_tokens)
    if "full_and_cross" in kinds and (settings.pp or 1) > 1:
        # ModelConfig.verify_with_parallel_config refuses a model without SupportsPP.
        raise ConfigError("pp: vLLM 0.34's model for this architecture (whisper.py) does not "
                          "support pipeline parallelism; expected pp 1", field="pp")
    return request


def refuse_short_encoder_budget(arch: RegularArchitecture, batched_tokens: int) -> None:
    """vLLM 0.34 disables chunked multimodal input for an encoder-decoder model
    (SchedulerConfig), so one encoder input must fit one step: `compute_mm_encoder_budget`
    (v1/core/encoder_cache_manager.py) refuses max_num_batched_tokens below its tokens when the
    scheduler starts. The cross-attention blocks are sized by the same budget."""
    if arch.encoder_tokens is not None and batched_tokens < arch.encoder_tokens:
        raise ConfigError(
            f"max_num_batched_tokens: vLLM 0.34 schedules an encoder-decoder model's whole "
            f"encoder input ({arch.encoder_tokens} tokens) in one step and refuses fewer "
            f"batched tokens; expected at least {arch.encoder_tokens}, got {batched_tokens}",
            field="max_num_batched_tokens",
        )


def _attention_first(
    decoder_layers: list[dict[str, Any]], names: LayerNames, layers: int, settings: Settings,
) -> list[dict[str, Any]]:
    """The attention caches first, in slot order, then each decoder layer's others: the order
    in which Zamba2's model (vLLM's zamba2.py) builds them, shared blocks before the layers.
    vLLM's Zamba2ForCausalLM supports no pipeline parallelism (no SupportsPP)."""
    if (settings.pp or 1) > 1:
        raise ConfigError("pp: vLLM 0.34's model for this architecture (zamba2.py) does not "
                          "support pipeline parallelism; expected pp 1", field="pp")
    slots = names.attention_slots or {}
    order = sorted(slots, key=lambda i: slots[i])
    attention = {names.name(names.attention, i, layers): i for i in order}
    first = {name: decoder_layers[i][name] for name, i in attention.items()}
    rest = [{name: spec for name, spec in caches.items() if name not in attention}
            for caches in decoder_layers]
    return [first, *rest]


def _attention_free_request(
    arch: RegularArchitecture, kinds: list[LayerKind], tp: int, max_model_len: int,
    settings: Settings,
) -> PlanRequest:
    """A model of state layers alone (Mamba-1, Mamba-2): vLLM 0.34 serves an attention-free
    model without prefix caching (`ModelConfig.is_prefix_caching_supported`), so
    `MambaModelConfig` makes each state one block of max_model_len tokens, with no attention
    page to pad it to."""
    if settings.prefix_caching:
        raise ConfigError(
            "prefix_caching: vLLM 0.34 does not cache prefixes of an attention-free model "
            "(its is_prefix_caching_supported); expected it unset or off",
            field="prefix_caching",
        )
    states, _ = _mamba_spec(arch, tp, 1, 1, max_model_len, mla=False)
    states.pop("page_size_padded", None)  # nothing to match: the page is the states' own
    names = arch.layer_names
    decoder_layers = [{names.name(names.mamba, i, len(kinds)): states} if kind != "none" else {}
                      for i, kind in enumerate(kinds)]
    return regular_plan_request(decoder_layers, max_model_len, settings)


def _kv_rows(
    arch: RegularArchitecture, tp: int, settings: Settings, cache_dtype: DType,
) -> dict[str, Any]:
    """An attention layer's K and V rows on one rank, in the vLLM version's default block."""
    return {"block_size": default_block_size(settings),
            "num_kv_heads": _per_rank(arch.kv_heads, tp, "num_key_value_heads"),
            "head_size": arch.head_size, "dtype": cache_dtype}


def _latent_row(
    arch: RegularArchitecture, kinds: list[LayerKind], settings: Settings, cache_dtype: DType,
) -> dict[str, Any]:
    """Plain MLA (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash, Kimi-Linear's attention layers): one
    latent row of kv_lora_rank + qk_rope_head_dim elements per token, the same on every
    tensor-parallel rank (vLLM replicates it); an fp8 cache stores one byte an element (576
    bytes for DeepSeek-V3). Beside MLA only state layers are planned (Kimi-Linear's KDA)."""
    odd = sorted(set(kinds) - {"mla", "linear", "mamba", "conv"})
    if odd:
        raise ConfigError(
            f"kinds: a model with MLA layers is planned with MLA and state layers only, got "
            f"{', '.join(odd)}"
        )
    return {"kind": "mla", "block_size": settings.block_size or MLA_BLOCK_SIZE,
            "head_size": (arch.kv_lora_rank or 0) + (arch.qk_rope_head_dim or 0),
            "dtype": cache_dtype}


def regular_plan_request(
    decoder_layers: list[dict[str, Any]],
    max_model_len: int,
    settings: Settings,
    *,
    mamba_cache_mode: str | None = None,
    chunked_local: bool = False,
) -> PlanRequest:
    """The request without HiSparse: each decoder layer's caches (name -> spec), in order, and
    the preset defaults overlaid with `settings` (pipeline stages split by decoder layer)."""
    chosen = Settings(**{**DEFAULTS.given(), **settings.given()})
    model = model_section(max_model_len, chosen, None)
    if mamba_cache_mode is not None:
        model["mamba_cache_mode"] = mamba_cache_mode
    return PlanRequest.model_validate(
        {
            "layers": {name: spec for layer in decoder_layers for name, spec in layer.items()},
            "model": model,
            "hisparse": None,
            "device": device_section(chosen, {}, [list(layer) for layer in decoder_layers]),
            "scheduler": scheduler_section(chosen, {}, chunked_local=chunked_local),
        }
    )


def refuse_unplannable(settings: Settings, dtypes: tuple[str, ...], why: str) -> None:
    """Refuse the settings a regular model cannot take: a cache dtype outside `dtypes` (the
    ones its caches can be planned in, `why`), and the HiSparse and MTP ones."""
    if settings.kv_dtype is not None and settings.kv_dtype not in dtypes:
        expected = " or ".join(dtypes)
        raise ConfigError(
            f"kv_dtype: this model's caches are planned in {expected} ({why}): expected "
            f"{expected}, got {settings.kv_dtype}",
            field="kv_dtype",
        )
    if settings.hisparse:
        raise ConfigError(
            "hisparse: this model is planned without HiSparse (no sparse-MLA source layers for "
            "it to offload)",
            field="hisparse",
        )
    for name, what in NOT_FOR_REGULAR.items():
        value = getattr(settings, name)
        if value is not None and value != 0:
            raise ConfigError(
                f"{name}: {what}, but this is a regular model planned without HiSparse; "
                "expected it unset",
                field=name,
            )


def _per_rank(total: int, tp: int, field: str) -> int:
    """Heads one of `tp` ranks keeps: a share, or one replicated head when tp exceeds them."""
    if total % tp and tp % total:
        raise ConfigError(
            f"tp: {field} ({total}) and the tensor-parallel ranks ({tp}) must divide one "
            "another",
            field="tp",
        )
    return max(total // tp, 1)


def _own_heads(arch: RegularArchitecture, i: int, attention: dict[str, Any],
               tp: int) -> dict[str, Any]:
    """Layer i's rows where its heads are its own (`RegularArchitecture.layer_heads`)."""
    heads = (arch.layer_heads or {}).get(i)
    if heads is None:
        return attention
    return {**attention, "num_kv_heads": _per_rank(heads[0], tp, "num_key_value_heads"),
            "head_size": heads[1]}


def _attention(arch: RegularArchitecture, kind: LayerKind, base: dict[str, Any]) -> dict[str, Any]:
    if kind == "sliding":
        return {"kind": "sliding_window", **base, "sliding_window": arch.sliding_window}
    if kind == "chunked":
        return {"kind": "chunked_local_attention", **base,
                "attention_chunk_size": arch.attention_chunk_size}
    return {"kind": "full_attention", **base}


def _mamba_spec(
    arch: RegularArchitecture, tp: int, token_bytes: int, block_size: int,
    max_model_len: int | None, *, mla: bool,
) -> tuple[dict[str, Any], int]:
    """The state layer spec, and the attention block size vLLM aligns to it (`token_bytes`:
    one token's attention page on this rank, K and V rows or an MLA latent row).

    `max_model_len` None: align mode (prefix caching), where the Mamba block is the attention
    block. Beside MLA the block is a multiple of 128 tokens (vLLM keeps TRTLLM's and
    FlashInfer's MLA decode kernels on whole 128-token kernel blocks)."""
    geometry = arch.state_geometry()
    if geometry is None:
        raise ConfigError("states: state layers need their state geometry; got none",
                          field="states")
    shapes, dtypes = geometry.state_shapes(tp), geometry.state_dtypes(DTYPE)
    state_bytes = sum(
        math.prod(shape) * dtype_size(dtype) for shape, dtype in zip(shapes, dtypes, strict=True)
    )
    checkpoint = geometry.prefill_checkpoint
    align = max(KERNEL_BLOCK, block_size)
    if mla:
        align = max(align, MLA_HYBRID_BLOCK)
    if max_model_len is None and checkpoint == "gdn_grid":
        align = math.lcm(align, CHECKPOINT_ALIGNMENT)
    aligned = align * -(-state_bytes // (align * token_bytes))
    block_size = max(block_size, aligned)
    spec: dict[str, Any] = {
        "kind": "mamba",
        "block_size": block_size if max_model_len is None else max_model_len,
        "state_shapes": shapes,
        "state_dtypes": dtypes,
    }
    if max_model_len is None and checkpoint == "gdn_grid":
        spec["num_prefill_checkpoint_blocks"] = 1
        spec["prefill_checkpoint_alignment"] = block_size
    elif checkpoint == "every_token":
        spec["num_prefill_checkpoint_blocks"] = 1
        spec["prefill_checkpoint_alignment"] = 1
    if block_size * token_bytes != state_bytes:
        spec["page_size_padded"] = block_size * token_bytes
    return spec, block_size
