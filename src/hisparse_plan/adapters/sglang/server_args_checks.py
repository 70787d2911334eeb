"""SGLang 0.5.23's own checks of ServerArgs fields the plan otherwise ignores: a combination
SGLang refuses at startup (its argument hooks, sglang/srt/arg_groups/) is refused here too,
with SGLang's reason, so that no deployment SGLang would not start is planned. One function a
check, each naming the hook it mirrors; a field not given reads as SGLang's default
(server_args_table.SERVER_ARGS_FIELDS). The fields these checks need beside the checked one
are either modelled (dcp_size, speculative_algorithm, kv_cache_dtype, pp_size, tp_size) or
refused unless at their default (server_args_table.UNPLANNED), which the checks take as given."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from hisparse_plan.adapters.sglang.server_args_table import default_of
from hisparse_plan.errors import UnsupportedRequestError


def _arg(server_args: Mapping[str, Any], name: str) -> Any:  # noqa: ANN401 (any field's value)
    """The field as given, else SGLang's declared default (None where it declares none)."""
    value = server_args.get(name)
    return default_of(name)[1] if value is None else value


def _refuse(field: str, why: str, got: object) -> UnsupportedRequestError:
    return UnsupportedRequestError(f"server_args.{field}: SGLang 0.5.23 refuses it at startup: "
                                   f"{why}; got {got!r}", field=f"server_args.{field}")


def check_dcp_comm_backend(server_args: Mapping[str, Any]) -> None:
    """--dcp-comm-backend a2a / fi_a2a and --dcp-replicate-q-proj act on decode context
    parallelism only: SGLang refuses them without --dcp-size above 1, and the Q-projection
    replication without an a2a backend (arg_groups/parallel_hook.py, its DCP checks)."""
    dcp = _arg(server_args, "dcp_size") or 1
    backend = _arg(server_args, "dcp_comm_backend")
    if backend in ("a2a", "fi_a2a") and dcp <= 1:
        raise _refuse("dcp_comm_backend", f"--dcp-comm-backend {backend} needs --dcp-size "
                      f"above 1 (dcp_size {dcp})", backend)
    if _arg(server_args, "dcp_replicate_q_proj"):
        if dcp <= 1:
            raise _refuse("dcp_replicate_q_proj", f"it needs --dcp-size above 1 (dcp_size "
                          f"{dcp})", True)
        if backend not in ("a2a", "fi_a2a"):
            raise _refuse("dcp_replicate_q_proj", "it needs --dcp-comm-backend a2a or fi_a2a "
                          f"(dcp_comm_backend {backend!r})", True)


def check_elastic_ep(server_args: Mapping[str, Any]) -> None:
    """Elastic EP's flags (arg_groups/parallel_hook.py, handle_elastic_ep): a backend needs one
    pipeline stage; --elastic-ep-join-mode and --max-ep-size need a backend; a join rank offset
    needs the scale join mode (which needs a positive offset and --node-rank 1);
    --elastic-ep-initial-size needs scale-up (a backend and --max-ep-size above tp_size).
    Scale-up itself asks for more than the plan reads (mooncake, --moe-a2a-backend nixl, which
    the plan refuses), so it is refused here as there."""
    backend = _arg(server_args, "elastic_ep_backend")
    join = _arg(server_args, "ep_join_mode")
    offset = _arg(server_args, "ep_join_rank_offset") or 0
    most = _arg(server_args, "max_ep_size")
    if backend is not None and (_arg(server_args, "pp_size") or 1) != 1:
        raise _refuse("elastic_ep_backend", "elastic EP needs --pp-size 1", backend)
    if join is not None and backend is None:
        raise _refuse("ep_join_mode", "--elastic-ep-join-mode needs --elastic-ep-backend", join)
    if join == "scale" and (_arg(server_args, "node_rank") != 1 or offset <= 0):
        raise _refuse("ep_join_mode", "a scale joiner needs --node-rank 1 and a positive "
                      "--elastic-ep-join-rank-offset", join)
    if offset != 0 and join != "scale":
        raise _refuse("ep_join_rank_offset", "--elastic-ep-join-rank-offset needs "
                      "--elastic-ep-join-mode scale", offset)
    if most is not None and (backend is None or most <= 0):
        raise _refuse("max_ep_size", "--max-ep-size needs --elastic-ep-backend and a positive "
                      "size", most)
    scaling = backend is not None and most is not None and most > (_arg(server_args, "tp_size")
                                                                   or 1)
    if _arg(server_args, "elastic_ep_initial_size") is not None and not scaling:
        raise _refuse("elastic_ep_initial_size", "it needs elastic EP scale-up "
                      "(--elastic-ep-backend with --max-ep-size above tp_size)",
                      _arg(server_args, "elastic_ep_initial_size"))
    if scaling:
        raise _refuse("max_ep_size", "elastic EP scale-up needs --moe-a2a-backend nixl, which "
                      "the plan does not model", most)


def check_http_worker_reuseport(server_args: Mapping[str, Any]) -> None:
    """--enable-http-worker-reuseport needs --tokenizer-worker-num above 1 and no HTTP/2
    (arg_groups/serving_hook.py)."""
    if _arg(server_args, "enable_http_worker_reuseport") and (
            (_arg(server_args, "tokenizer_worker_num") or 1) == 1
            or _arg(server_args, "enable_http2")):
        raise _refuse("enable_http_worker_reuseport", "it needs --tokenizer-worker-num above 1 "
                      "and no --enable-http2", True)


BLOCK_VERIFICATION: Final = frozenset({"EAGLE", "EAGLE3", "NEXTN", "DFLASH", "DSPARK"})
"""Speculative algorithms block verification runs with (NEXTN is EAGLE to SGLang)."""


def check_speculative_extras(server_args: Mapping[str, Any]) -> None:
    """Block verification needs an EAGLE-family algorithm on CUDA; a draft sink size needs a
    draft window size and no negative count (arg_groups/speculative_hook.py)."""
    algorithm = _arg(server_args, "speculative_algorithm")
    if _arg(server_args, "speculative_use_block_verification") and (
            str(algorithm).upper() not in BLOCK_VERIFICATION):
        raise _refuse("speculative_use_block_verification", "it runs with EAGLE / EAGLE3 / "
                      f"NEXTN / DFLASH / DSPARK only (speculative_algorithm {algorithm!r})",
                      True)
    sink = _arg(server_args, "speculative_draft_sink_size")
    if sink is not None and (int(sink) < 0
                             or _arg(server_args, "speculative_draft_window_size") is None):
        raise _refuse("speculative_draft_sink_size", "it needs --speculative-draft-window-size "
                      "and a count of at least 0", sink)


def check_prefill_kv_dequant(server_args: Mapping[str, Any]) -> None:
    """--prefill-kv-cache-dequant-dtype other than auto applies only to an nvfp4 KV cache
    (arg_groups/kv_cache_hook.py, handle_nvfp4_prefill_kv_dequant_dtype)."""
    dtype = _arg(server_args, "prefill_kv_cache_dequant_dtype")
    if dtype not in (None, "auto") and _arg(server_args, "kv_cache_dtype") != "nvfp4":
        raise _refuse("prefill_kv_cache_dequant_dtype", "it applies only with --kv-cache-dtype "
                      "nvfp4", dtype)


def check_layernorm_sp(server_args: Mapping[str, Any]) -> None:
    """MegaMoE for layernorm sequence parallelism needs --enable-layernorm-sp
    (arg_groups/layernorm_sp_hook.py, handle_layernorm_sp), which SGLang takes for Muse Spark
    and Qwen3ForCausalLM only (layers/layernorm_sp.py) and MegaMoE for Muse Spark only."""
    if _arg(server_args, "enable_megamoe_for_layernorm_sp") and not _arg(
            server_args, "enable_layernorm_sp"):
        raise _refuse("enable_megamoe_for_layernorm_sp", "it needs --enable-layernorm-sp",
                      True)


def check_linker_mla_dedup(server_args: Mapping[str, Any]) -> None:
    """--enable-linker-mla-dedup needs the Mooncake unified-cache linker
    (arg_groups/hicache_hook.py), an external KV cache the plan refuses."""
    if _arg(server_args, "enable_linker_mla_dedup") and not (
            _arg(server_args, "enable_unified_cache_external_linker")
            and _arg(server_args, "unified_cache_external_linker_backend") == "mooncake"):
        raise _refuse("enable_linker_mla_dedup", "it needs the Mooncake linker "
                      "(--enable-unified-cache-external-linker)", True)


def check_quantize_and_serve(server_args: Mapping[str, Any]) -> None:
    """--quantize-and-serve: SGLang's ModelConfig refuses it without a ModelOpt quantization
    and, with one, raises NotImplementedError (configs/model_config.py,
    _validate_quantize_and_serve_config): it never starts."""
    if _arg(server_args, "quantize_and_serve"):
        raise _refuse("quantize_and_serve", "it is disabled in SGLang 0.5.23 (and needs a "
                      "ModelOpt --quantization)", True)


def check_hicache_host_fraction(server_args: Mapping[str, Any]) -> None:
    """--hicache-host-memory-fraction is a share in (0, 1], checked whether or not the
    hierarchical cache is on (arg_groups/hicache_hook.py, handle_hicache_ratio_default)."""
    fraction = _arg(server_args, "hicache_host_memory_fraction")
    if fraction is not None and not 0 < fraction <= 1:
        raise _refuse("hicache_host_memory_fraction", "it must be in (0, 1]", fraction)


def check_moe_dp(server_args: Mapping[str, Any]) -> None:
    """--moe-dp-size above 1 runs only as wide as attention context parallelism: SGLang
    asserts attn_cp_size == moe_dp_size unless moe_dp_size is 1 (arg_groups/parallel_hook.py),
    and attention context parallelism is a field the plan refuses (UNPLANNED)."""
    moe_dp = _arg(server_args, "moe_dp_size") or 1
    if moe_dp > 1 and (_arg(server_args, "attn_cp_size") or 1) != moe_dp:
        raise _refuse("moe_dp_size", "attn_cp_size != moe_dp_size runs only with moe_dp_size "
                      "1", moe_dp)


def check_flashinfer_a2a_dispatch(server_args: Mapping[str, Any]) -> None:
    """--flashinfer-a2a-dispatch-type other than auto needs --moe-a2a-backend flashinfer
    (arg_groups/moe_hook.py, handle_a2a_moe), an all-to-all backend the plan does not take:
    SGLang's MoE all-to-all is read as given (none unless deepep)."""
    dispatch = _arg(server_args, "flashinfer_a2a_dispatch_type")
    if dispatch not in (None, "auto") and _arg(server_args, "moe_a2a_backend") != "flashinfer":
        raise _refuse("flashinfer_a2a_dispatch_type", "it needs --moe-a2a-backend flashinfer",
                      dispatch)


def check_eplb(server_args: Mapping[str, Any]) -> None:
    """Expert placement (arg_groups/parallel_hook.py, handle_eplb_and_dispatch): without an
    all-to-all backend every EP rank runs the MoE over the same tokens, so
    --ep-dispatch-algorithm static or lp is refused; --enable-eplb (outside a scale joiner)
    asserts more than one expert-parallel rank, SGLang's ep_size resolved as tp_size under
    DeepEP (arg_groups/overrides.py, _a2a_ep_size), else as given."""
    deepep = _arg(server_args, "moe_a2a_backend") == "deepep"
    dispatch = _arg(server_args, "ep_dispatch_algorithm")
    if not deepep and dispatch in ("static", "lp"):
        raise _refuse("ep_dispatch_algorithm", f"{dispatch} needs an all-to-all backend "
                      "(--moe-a2a-backend)", dispatch)
    ep = (_arg(server_args, "tp_size") or 1) if deepep else (_arg(server_args, "ep_size") or 1)
    if _arg(server_args, "enable_eplb") and _arg(server_args, "ep_join_mode") != "scale" and (
            ep <= 1):
        raise _refuse("enable_eplb", f"it needs more than one expert-parallel rank (ep_size "
                      f"{ep})", True)


def check_ssl_refresh(server_args: Mapping[str, Any]) -> None:
    """--enable-ssl-refresh needs --ssl-certfile and --ssl-keyfile
    (arg_groups/serving_hook.py)."""
    if _arg(server_args, "enable_ssl_refresh") and not (
            _arg(server_args, "ssl_certfile") and _arg(server_args, "ssl_keyfile")):
        raise _refuse("enable_ssl_refresh", "it needs --ssl-certfile and --ssl-keyfile", True)


def check_lm_head(server_args: Mapping[str, Any]) -> None:
    """The LM head's DP modes need attention DP (arg_groups/overrides.py,
    _dp_lm_head_validation): --enable-dp-lm-head, which SGLang turns off itself on a single DP
    rank (_data_parallelism_defaults) but not over --dp-size replicas; and
    --enable-tp-lm-head-all-to-all, which moreover needs tp_size equal to the attention DP size
    and no --enable-dp-lm-head."""
    dp = _arg(server_args, "dp_size") or 1
    attn_dp = dp if _arg(server_args, "enable_dp_attention") else 1
    dp_head = bool(_arg(server_args, "enable_dp_lm_head")) and dp > 1
    if dp_head and attn_dp <= 1:
        raise _refuse("enable_dp_lm_head", "it needs attention DP (over --dp-size replicas "
                      "without --enable-dp-attention)", True)
    if not _arg(server_args, "enable_tp_lm_head_all_to_all"):
        return
    tp = _arg(server_args, "tp_size") or 1
    if attn_dp <= 1 or dp_head or tp != attn_dp:
        raise _refuse("enable_tp_lm_head_all_to_all", f"it needs attention DP over every rank "
                      f"(tp_size {tp}, attention DP {attn_dp}) and no --enable-dp-lm-head",
                      True)


def check_linear_attn_backends(server_args: Mapping[str, Any],
                               capability: tuple[int, int] | None = None) -> None:
    """Linear-attention kernels (arg_groups/attention_hook.py, handle_linear_attn_backend):
    FlashKDA has no decode kernel, so an explicit --linear-attn-decode-backend flashkda is
    refused; FlashInfer's decode and verify kernels on SM100 and later (a `capability` of 10
    or more; none given is Hopper) need --mamba-ssm-dtype bfloat16. (Its prefill kernel there
    also needs CUDA 13, which the plan is not told.)"""
    decode_given = _arg(server_args, "linear_attn_decode_backend")
    if decode_given == "flashkda":
        raise _refuse("linear_attn_decode_backend", "FlashKDA is prefill-only", decode_given)
    if capability is None or capability[0] < 10 or (
            _arg(server_args, "mamba_ssm_dtype") == "bfloat16"):
        return
    decode = decode_given or _arg(server_args, "linear_attn_backend")
    if decode == "flashkda":
        decode = "triton"  # SGLang falls back to triton for an inherited flashkda
    verify = _arg(server_args, "linear_attn_verify_backend") or (
        "flashinfer" if decode == "flashinfer" else None)
    for field, backend in (("linear_attn_decode_backend", decode),
                           ("linear_attn_verify_backend", verify)):
        if backend == "flashinfer":
            raise _refuse(field, "FlashInfer's linear-attention kernels on SM100 and later "
                          "need --mamba-ssm-dtype bfloat16", backend)


CHECKS: Final[tuple[Callable[[Mapping[str, Any]], None], ...]] = (
    check_dcp_comm_backend, check_elastic_ep, check_http_worker_reuseport,
    check_speculative_extras, check_prefill_kv_dequant, check_layernorm_sp,
    check_linker_mla_dedup, check_quantize_and_serve, check_hicache_host_fraction,
    check_moe_dp, check_flashinfer_a2a_dispatch, check_eplb, check_ssl_refresh,
    check_lm_head,
)


def check_server_args(server_args: Mapping[str, Any],
                      capability: tuple[int, int] | None = None) -> None:
    """Every check above, in turn (the first refusal wins), then those that read the GPU's
    compute capability."""
    for check in CHECKS:
        check(server_args)
    check_linear_attn_backends(server_args, capability)


SP_ARCHITECTURES: Final = frozenset({"MuseSparkForConditionalGeneration", "Qwen3ForCausalLM"})
"""The architectures SGLang's layernorm sequence parallelism serves (layers/layernorm_sp.py,
SP_SUPPORTED_ARCHITECTURES)."""


def _attn_tp(server_args: Mapping[str, Any]) -> int:
    """SGLang's attention TP width: tp_size over the attention DP groups (dp_size with
    --enable-dp-attention) and attention context parallelism."""
    tp = _arg(server_args, "tp_size") or 1
    dp = (_arg(server_args, "dp_size") or 1) if _arg(server_args, "enable_dp_attention") else 1
    return max(1, int(tp) // (int(dp) * int(_arg(server_args, "attn_cp_size") or 1)))


def check_layernorm_sp_model(server_args: Mapping[str, Any], architecture: str) -> None:
    """--enable-layernorm-sp (arg_groups/layernorm_sp_hook.py, validate_layernorm_sp): Muse
    Spark or Qwen3ForCausalLM only, over more than one TP rank, without attention DP, pipeline
    stages or speculative decoding (but Muse Spark's DFLASH). Muse Spark's also needs the
    flashinfer all-to-all or MegaMoE, which the plan does not take."""
    if not _arg(server_args, "enable_layernorm_sp"):
        return
    why = None
    if architecture not in SP_ARCHITECTURES:
        why = f"it serves {', '.join(sorted(SP_ARCHITECTURES))} only, not {architecture}"
    elif (_arg(server_args, "tp_size") or 1) <= 1:
        why = "it needs tp_size above 1"
    elif architecture != "Qwen3ForCausalLM":
        why = "Muse Spark's needs the flashinfer all-to-all or MegaMoE"
    elif _arg(server_args, "enable_dp_attention") and (_arg(server_args, "dp_size") or 1) > 1:
        why = "it does not run with attention DP"
    elif _arg(server_args, "speculative_algorithm") is not None:
        why = "it does not run with speculative decoding"
    elif (_arg(server_args, "pp_size") or 1) > 1:
        why = "it does not run with pipeline stages"
    if why is not None:
        raise _refuse("enable_layernorm_sp", why, True)


def check_shared_experts_tp(server_args: Mapping[str, Any], architecture: str) -> None:
    """--shared-experts-tp-size (arg_groups/parallel_hook.py, handle_shared_experts_tp): a
    positive divisor of the attention TP width, for Kimi-K3 only, with an expert-parallel
    all-to-all (deepep, megamoe, mooncake, ascend_fuseep, mori)."""
    size = _arg(server_args, "shared_experts_tp_size")
    if size is None:
        return
    attn_tp = _attn_tp(server_args)
    if size < 1 or attn_tp % size:
        raise _refuse("shared_experts_tp_size", f"it must be a positive divisor of the "
                      f"attention TP size ({attn_tp})", size)
    if architecture != "KimiK3ForConditionalGeneration":
        raise _refuse("shared_experts_tp_size", f"it serves Kimi-K3 only, not {architecture}",
                      size)
    if _arg(server_args, "moe_a2a_backend") != "deepep":
        raise _refuse("shared_experts_tp_size", "it needs an expert-parallel all-to-all "
                      "(of those the plan takes, deepep)", size)


MODEL_CHECKS: Final[tuple[Callable[[Mapping[str, Any], str], None], ...]] = (
    check_layernorm_sp_model, check_shared_experts_tp,
)


def check_model_server_args(server_args: Mapping[str, Any], architecture: str) -> None:
    """The checks that read the model SGLang serves (its architectures[0]), in turn."""
    for check in MODEL_CHECKS:
        check(server_args, architecture)


__all__ = ["CHECKS", "MODEL_CHECKS", "check_model_server_args", "check_server_args"]
