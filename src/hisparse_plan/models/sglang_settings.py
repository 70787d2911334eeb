"""The SGLang server settings a request carries (see docs/planning-rules.md#sglang)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from hisparse_plan.models.base import ByteCount, Model, PositiveInt

Fraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]

SpecCount = Annotated[int, Field(ge=1, le=2**20)]
SpeculativeAlgorithm = Literal["NEXTN", "EAGLE", "EAGLE3"]
"""The speculative algorithms planned: SGLang 0.5.23's EAGLE family with a KV-holding draft."""

SGLangKVDType = Literal["auto", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2"]
DSABackend = Literal["flashmla_kv", "trtllm", "tilelang", "flashmla_sparse", "fa3"]


class SGLangSettings(Model):
    """The SGLang 0.5.23 server arguments that move its KV pools (`--page-size`,
    `--kv-cache-dtype`, ...); what is left out takes SGLang's default."""

    name: Literal["sglang"] = Field(description="The engine: sglang.")
    page_size: PositiveInt | None = Field(
        default=None,
        description="Tokens per page; null: SGLang's default for the model (64 for DSA "
        "models, 256 for DeepSeek-V4, else 1).",
    )
    kv_cache_dtype: SGLangKVDType = Field(
        default="auto", description="`--kv-cache-dtype`; auto keeps the layers' own dtype."
    )
    dsa_backend: DSABackend | None = Field(
        default=None,
        description="DSA models: the attention backend, which decides the latent row (656 "
        "bytes with flashmla_kv and fp8, 576 with trtllm or tilelang); null: flashmla_kv.",
    )
    context_length: PositiveInt = Field(
        description="`--context-length`: the request-to-token table's width and the "
        "request estimate."
    )
    max_running_requests: PositiveInt | None = Field(
        default=None, description="`--max-running-requests`; null: SGLang's estimate."
    )
    max_total_tokens: PositiveInt | None = Field(
        default=None, description="`--max-total-tokens`: a cap on the full pool's tokens."
    )
    mem_fraction_static: Fraction | None = Field(
        default=None,
        description="`--mem-fraction-static`; null: SGLang's rule for the GPU (needs "
        "gpu_memory_bytes).",
    )
    gpu_memory_bytes: ByteCount | None = Field(
        default=None,
        description="The GPU's total memory as SGLang reads it (nvidia-smi memory.total, whole "
        "MiB): the input of SGLang's default mem_fraction_static, chunked prefill size and "
        "decode graph batch; null: unknown (a null fraction is then refused with memory "
        "figures).",
    )
    tp_size: PositiveInt = Field(
        default=1,
        description="`--tp-size`: only SGLang's default fraction reads it (the layers are "
        "already one rank's).",
    )
    enable_dp_attention: bool = Field(
        default=False,
        description="`--enable-dp-attention`: attention data parallelism over dp_size groups "
        "of tp_size / dp_size ranks (the layers are one attention rank's); a given "
        "max_running_requests is shared by the dp_size groups, and SGLang's default fraction "
        "keeps more back for graphs.",
    )
    dp_size: PositiveInt = Field(
        default=1,
        description="`--dp-size`: with enable_dp_attention, the attention data-parallel "
        "groups (tp_size must be a multiple); without it, replicas that each size their own "
        "pools as one.",
    )
    pp_size: PositiveInt = Field(
        default=1,
        description="`--pp-size`: pipeline stages; each rank keeps the decoder layers SGLang's "
        "get_pp_indices gives it (the last num_layers % pp_size ranks one more), and every "
        "rank's pools take the fewest tokens any rank's budget holds.",
    )
    pp_rank: Annotated[int, Field(ge=0)] = Field(
        default=0,
        description="The pipeline rank this plan is for (SGLang's get_parallel().pp_rank: each "
        "rank is its own process and allocates its own pools); below pp_size.",
    )
    moe_a2a_backend: Literal["none", "deepep"] = Field(
        default="none",
        description="`--moe-a2a-backend`: deepep keeps 2 GiB (and 1 GiB more with prefill "
        "graphs) out of SGLang's default fraction for its all-to-all buffers.",
    )
    deepep_mode: Literal["auto", "normal", "low_latency"] = Field(
        default="auto",
        description="`--deepep-mode`: taken and left alone. With moe_a2a_backend deepep, "
        "normal turns SGLang's CUDA graphs off in its MoE hook, after its default "
        "mem_fraction_static was resolved with them, so no pool moves.",
    )
    disable_overlap_schedule: bool = Field(
        default=False,
        description="`--disable-overlap-schedule`: the overlap scheduler off (as pipeline "
        "stages turn it off): a Mamba hybrid's radix cache keeps one tracking slot a request, "
        "not two, and a window pool one prefill chunk in flight.",
    )
    dcp_size: PositiveInt = Field(
        default=1,
        description="`--dcp-size` (DSA models): decode context parallelism over dcp_size "
        "ranks of an attention group; the latent rows shard (dcp_size token ids a stored row), "
        "the index keys stay whole (charged dcp_size times a token).",
    )
    disable_radix_cache: bool = Field(
        default=False,
        description="`--disable-radix-cache` (prefill/decode nodes): a Mamba hybrid keeps one "
        "state slot a request (max_running_requests // dp_size slots when that is given), and "
        "a window model's window pool is sized for max_running_requests (when given) rather "
        "than by swa_full_tokens_ratio.",
    )
    chunked_prefill_size: PositiveInt | None = Field(
        default=None,
        description="`--chunked-prefill-size`: tokens of one prefill chunk; null: SGLang's "
        "default for the GPU's memory (2048 to 16384).",
    )
    disable_decode_cuda_graph: bool = Field(
        default=False,
        description="`--disable-decode-cuda-graph`: no decode graphs, so no memory is kept "
        "back for them.",
    )
    disable_prefill_cuda_graph: bool = Field(
        default=False,
        description="`--disable-prefill-cuda-graph`: no prefill graphs (SGLang captures them "
        "on CUDA by default), so no memory is kept back for them.",
    )
    pre_model_load_free_bytes: ByteCount | None = Field(
        default=None,
        description="Free GPU bytes before the weights load; with post_weights_free_bytes the "
        "KV budget follows SGLang's formula, else device.available_bytes is the budget.",
    )
    post_weights_free_bytes: ByteCount | None = Field(
        default=None, description="Free GPU bytes once the weights are loaded."
    )
    swa_full_tokens_ratio: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="Window pool tokens per full pool token; null: 0.8 (0.1 for DeepSeek-V4).",
    )
    mamba_full_memory_ratio: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        default=0.9, description="Mamba state bytes per KV byte of the budget."
    )
    max_mamba_cache_size: PositiveInt | None = Field(
        default=None, description="`--max-mamba-cache-size`: state slots; null: from the ratio."
    )
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None,
        description="`--mamba-ssm-dtype`: the recurrent (temporal) state's element type; null: "
        "float32, SGLang's default when the model config names none.",
    )
    speculative_algorithm: SpeculativeAlgorithm | None = Field(
        default=None,
        description="`--speculative-algorithm` (upper-cased as SGLang does): NEXTN (a "
        "DeepSeek-style model's own MTP layers as the draft; SGLang runs it as EAGLE), EAGLE or "
        "EAGLE3 (a draft model beside the target); null: no speculative decoding.",
    )
    speculative_num_steps: SpecCount | None = Field(
        default=None, description="`--speculative-num-steps`; null: SGLang's choice for the "
        "architecture (3; 5 for Llama and Grok), given only with the two below null.",
    )
    speculative_eagle_topk: SpecCount | None = Field(
        default=None, description="`--speculative-eagle-topk`; null: SGLang's choice (1; 4 "
        "for Llama and Grok).",
    )
    speculative_num_draft_tokens: SpecCount | None = Field(
        default=None, description="`--speculative-num-draft-tokens`; null: SGLang's choice "
        "(4; 8 for Llama and Grok); num_steps + 1 whenever eagle_topk is 1.",
    )
    speculative_draft_num_layers: SpecCount | None = Field(
        default=None,
        description="The draft model's KV layers, as SGLang counts them "
        "(eagle_draft_num_layers): for NEXTN the model's num_nextn_predict_layers; for "
        "EAGLE/EAGLE3 the draft config's num_nextn_predict_layers, else its num_hidden_layers. "
        "Required with a speculative_algorithm (a request carries the draft's shape, which no "
        "layer of the target describes).",
    )
    speculative_draft_window_layers: Annotated[int, Field(ge=0, le=2**20)] = Field(
        default=0,
        description="Of the draft's layers, those that are sliding-window layers of a "
        "hybrid-window draft (eagle_draft_swa_num_layers); they join the window pool's cell.",
    )
    speculative_draft_window_layer_ids: list[Annotated[int, Field(ge=0, le=2**20)]] | None = (
        Field(
            default=None,
            description="A hybrid-window draft's window layers by its own layer ids (SGLang's "
            "swa_attention_layer_ids of the draft config): its pool keeps them in a window "
            "pool beside the full one. Required with speculative_draft_window_layers above "
            "0, as many ids as that count.",
        )
    )
    speculative_draft_kv_heads: PositiveInt | None = Field(
        default=None,
        description="An MHA draft's KV heads on one attention rank (SGLang's "
        "get_num_kv_heads(attn_tp_size) of the draft config); null: the target's "
        "full-attention heads. MLA drafts keep the target's latent row.",
    )
    speculative_draft_head_dim: PositiveInt | None = Field(
        default=None,
        description="An MHA draft's head_dim (K and V); null: the target's full-attention "
        "head size.",
    )
    speculative_draft_context_length: PositiveInt | None = Field(
        default=None,
        description="A separate draft checkpoint's own context length as SGLang derives it "
        "from its config.json; a context_length above it is refused unless "
        "allow_overwrite_longer_context_len (SGLang's draft ModelConfig, handed a given "
        "context_length, refuses it); null: the target's own checkpoint, no context_length "
        "given (the draft derives its own), or unknown.",
    )
    enable_hisparse: bool = Field(default=False, description="`--enable-hisparse`.")
    hisparse_top_k: PositiveInt = Field(default=2048, description="HiSparse top_k.")
    hisparse_device_buffer_size: PositiveInt | None = Field(
        default=None, description="Hot rows per request; null: 2 * top_k."
    )
    hisparse_host_to_device_ratio: PositiveInt = Field(
        default=2, description="Host tokens per device token."
    )

    compute_capability: Annotated[
        tuple[PositiveInt, Annotated[int, Field(ge=0, le=9)]], Field(strict=False)
    ] | None = Field(
        default=None,
        description="The GPU's CUDA compute capability [major, minor] as SGLang reads it "
        "(torch.cuda.get_device_capability): Blackwell (10.x) defaults a DSA model's kv cache "
        "to fp8 with trtllm backends and pages trtllm attention by 64; null: Hopper (9.0).",
    )
    architecture: str | None = Field(
        default=None,
        description="The config's architectures[0] (SGLang picks its model class, window "
        "pools and backend defaults by it); null: unknown, judged from the layers alone.",
    )
    model_context_length: PositiveInt | None = Field(
        default=None,
        description="The model's own context length as SGLang derives it from config.json; "
        "a longer context_length is refused unless allow_overwrite_longer_context_len; null: "
        "unknown, not checked.",
    )
    enable_multimodal: bool | None = Field(
        default=None,
        description="`--enable-multimodal`: a multimodal model's runtime keeps 100 MB "
        "(SGLANG_VLM_CACHE_SIZE_MB) out of the KV budget; null: SGLang's default (on, except "
        "for Gemma-3, Llama-4, Step3-VL and Inkling multimodal checkpoints).",
    )
    model_is_multimodal: bool | None = Field(
        default=None,
        description="Whether SGLang counts the model as multimodal (a multimodal architecture, "
        "or a config with a text_config); null: judged by the architecture.",
    )
    vision_encoder: Annotated[
        tuple[PositiveInt, PositiveInt], Field(strict=False)
    ] | None = Field(
        default=None,
        description="The config's vision_config as SGLang reads it for its default "
        "mem_fraction_static: [num_hidden_layers, hidden_size] (24 and 1024 where the config "
        "leaves one out); a multimodal model's default fraction shrinks with the encoder's "
        "size. null: no vision_config, the fraction is left as is.",
    )
    allow_overwrite_longer_context_len: bool = Field(
        default=False,
        description="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in SGLang's environment: a "
        "context_length above the model's is served rather than refused.",
    )

    @field_validator("speculative_algorithm", mode="before")
    @classmethod
    def _upper_algorithm(cls, value: object) -> object:
        """SGLang upper-cases the algorithm's name before reading it."""
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _dp_divides_tp(self) -> SGLangSettings:
        if self.enable_dp_attention and self.tp_size % self.dp_size:
            raise ValueError(
                f"engine.dp_size: DP attention splits tp_size into dp_size groups; expected a "
                f"divisor of tp_size {self.tp_size}, got {self.dp_size}"
            )
        return self

    @model_validator(mode="after")
    def _pp_rank_in_range(self) -> SGLangSettings:
        if self.pp_rank >= self.pp_size:
            raise ValueError(
                f"engine.pp_rank: a rank of the {self.pp_size} pipeline stages; expected 0 to "
                f"{self.pp_size - 1}, got {self.pp_rank}"
            )
        return self

    @model_validator(mode="after")
    def _memory_given_whole(self) -> SGLangSettings:
        if (self.pre_model_load_free_bytes is None) != (self.post_weights_free_bytes is None):
            raise ValueError(
                "engine.pre_model_load_free_bytes and engine.post_weights_free_bytes go "
                "together: expected both or neither"
            )
        return self
