"""Whisper (`model_type` "whisper"), an encoder-decoder model: vLLM 0.34's `models/whisper.py`
(`WhisperForConditionalGeneration`).

The encoder's attention keeps no cache (`WhisperEncoderAttention`, an MMEncoderAttention). Each
of the `decoder_layers` decoder layers keeps two: `self_attn`, full attention over the decoder's
own tokens (`Attention`, AttentionType.DECODER), and `encoder_attn`, attention to the encoder's
output (`CrossAttention`, whose spec is vLLM's CrossAttentionSpec). Both are `WhisperAttention`s
of `decoder_attention_heads` heads, `d_model / decoder_attention_heads` elements wide (it
refuses a width that does not divide), with a KV head per query head. vLLM builds the model
with an empty prefix and gives each decoder layer `{prefix}.layers` again, so the caches are
named `.decoder.layers.{i}.layers.self_attn.attn` and
`.decoder.layers.{i}.layers.encoder_attn.attn`.

The decoder reads `max_target_positions` tokens (vLLM's `_get_and_verify_max_len` takes it as
the model's length). The encoder's tokens (`max_source_positions`, one audio input:
`get_num_audio_tokens`) size no cache: vLLM sizes the cross-attention block table by its
encoder budget, max_num_batched_tokens (docs/planning-rules.md#cross-attention); but an
encoder-decoder model schedules a whole input in one step, so vLLM refuses a
max_num_batched_tokens below them (`regular_request.refuse_short_encoder_budget`).

SGLang 0.5.23 serves Whisper too (`srt/models/whisper.py`), but keeps the encoder's tokens in
its one token pool of `encoder_layers + 2 * decoder_layers` layers (`num_attention_layers` in
its configs/model_config.py), which the SGLang target does not lay out: refused.
"""

from __future__ import annotations

from typing import Any, Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base

NAMES: Final = {
    "attention": ".decoder.layers.{i}.layers.self_attn.attn",
    "cross": ".decoder.layers.{i}.layers.encoder_attn.attn",
}
SGLANG: Final = base.SGLangRule(
    refusal="SGLang 0.5.23 serves Whisper (srt/models/whisper.py) with the encoder's tokens in "
            "its one token pool of encoder_layers + 2 x decoder_layers layers, which the SGLang "
            "target does not lay out yet")


def decoder_fields(fields: base.Fields) -> dict[str, Any]:
    """The decoder's geometry under the names the reader reads: Whisper's config counts
    `decoder_layers` of `decoder_attention_heads` heads over `d_model`, and the decoder's
    context is `max_target_positions`."""
    layers = base.positive(fields, "decoder_layers", "Whisper's decoder layers")
    heads = base.positive(fields, "decoder_attention_heads", "Whisper's decoder heads")
    width = base.positive(fields, "d_model", "Whisper's model width")
    if width % heads:
        raise ConfigError(
            f"d_model: Whisper's attention (WhisperAttention) needs d_model divisible by "
            f"decoder_attention_heads ({heads}); expected a multiple of {heads}, got {width}",
            field="d_model",
        )
    length = base.positive(fields, "max_target_positions", "Whisper's decoder context")
    encoder = base.positive(fields, "max_source_positions", "Whisper's encoder input tokens")
    return {"num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": heads, "hidden_size": width, "head_dim": width // heads,
            "max_position_embeddings": length, "encoder_tokens": encoder}


def read_whisper(fields: base.Fields, layers: int) -> base.Layout:
    return base.Layout(["full_and_cross"] * layers, (), names=NAMES)


WHISPER = base.Family(
    name="whisper",
    model_types=("whisper",),
    architectures=("WhisperForConditionalGeneration",),
    read=read_whisper,
    vllm="models/whisper.py",
    sglang=SGLANG,
    renamed=decoder_fields,
)
