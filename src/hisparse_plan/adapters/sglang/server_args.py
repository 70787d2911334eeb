"""SGLang's own `ServerArgs` object (or anything with its attribute names) as our settings and
request: the arguments that move SGLang's pools are read off it by name, the hundreds of others
left alone. SGLang is never imported here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from hisparse_plan.adapters.sglang.request import (
    SERVER_ARGS,
    hisparse_config_object,
    request_from_server_args,
    settings_from_server_args,
)
from hisparse_plan.errors import PlanError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import Architecture

SAME_NAME: Final = tuple(key for key in SERVER_ARGS if key != "dsa_backend")
"""Settings SGLang's ServerArgs holds under the same name."""
RAW_ROW_BACKENDS: Final = frozenset({"trtllm"})
"""DSA backends that keep raw 576-byte latent rows whichever role runs them."""


def server_args_mapping(server_args: object) -> dict[str, Any]:
    """The pool-moving arguments of an SGLang ServerArgs object, as a case's server_args:
    unset (None) ones omitted; the DSA backend from its prefill and decode backends (trtllm on
    either keeps raw rows, tilelang must run both); `disable_cuda_graph` as both graph
    switches; attention DP as enable_dp_attention with dp_size (a resolved ServerArgs
    calls it attn_dp_size); an all-to-all backend other than deepep as none."""
    mapping = {key: getattr(server_args, key) for key in SAME_NAME
               if getattr(server_args, key, None) is not None}
    prefill = getattr(server_args, "dsa_prefill_backend", None)
    decode = getattr(server_args, "dsa_decode_backend", None)
    if RAW_ROW_BACKENDS & {prefill, decode}:
        mapping["dsa_backend"] = "trtllm"
    elif prefill == decode == "tilelang":
        mapping["dsa_backend"] = "tilelang"
    attn_dp = getattr(server_args, "attn_dp_size", None)
    if isinstance(attn_dp, int) and attn_dp > 1:
        # A resolved ServerArgs keeps `--dp-size N --enable-dp-attention` as attn_dp_size N.
        mapping["enable_dp_attention"], mapping["dp_size"] = True, attn_dp
    if mapping.get("moe_a2a_backend") not in (None, "deepep"):
        # Only DeepEP's buffers move SGLang's pools (its default fraction).
        mapping["moe_a2a_backend"] = "none"
    if getattr(server_args, "disable_cuda_graph", False):
        mapping["disable_decode_cuda_graph"] = mapping["disable_prefill_cuda_graph"] = True
    if getattr(server_args, "enable_hisparse", False):
        config = getattr(server_args, "hisparse_config", None)
        mapping["hisparse_config"] = {} if config is None else dict(
            hisparse_config_object(config))
    return mapping


def settings_from_sglang(
    server_args: object, memory: Mapping[str, Any] | None = None,
    *, gpu: Mapping[str, Any] | None = None,
) -> SGLangSettings:
    """SGLangSettings from SGLang's ServerArgs (its `context_length` must be set, as SGLang
    sets it once it has read the model)."""
    return settings_from_server_args(server_args_mapping(server_args), memory, gpu=gpu)


def request_from_sglang(
    server_args: object, memory: Mapping[str, Any],
    *, config: Mapping[str, Any] | str | Path | Architecture | None = None,
    gpu: Mapping[str, Any] | None = None,
) -> PlanRequest:
    """The request for the model SGLang's ServerArgs serves: its config.json (`config`, else
    `model_path`/config.json) read as the project reads any, or the architecture `config`
    gives, the heads split by its tp_size."""
    if config is None:
        model_path = getattr(server_args, "model_path", None)
        if not isinstance(model_path, str):
            raise PlanError("server_args.model_path: expected a local model folder holding "
                            f"config.json, or config=..., got {model_path!r}",
                            field="server_args.model_path")
        config = Path(model_path) / "config.json"
    return request_from_server_args(config, server_args_mapping(server_args), memory, gpu=gpu)
