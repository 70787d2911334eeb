"""What a public entry point was given, when it is a near miss of what it takes: a preset where
an architecture goes, a CLI spelling of a field, a path where JSON text goes. Each is one
PlanError naming what was expected and what came, with the right spelling where there is one."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping

from hisparse_plan.errors import PlanError
from hisparse_plan.models.json_input import MAX_DEPTH, load_json_object
from hisparse_plan.models.request import PlanRequest

REQUEST_SPELLINGS: dict[str, str] = {
    "gpu_mem": "device.available_bytes",
    "gpu_mem_bytes": "device.available_bytes",
    "gpu_memory_utilization": "device.available_bytes (bytes for the KV cache, not a fraction)",
    "kv_cache_memory_bytes": "device.available_bytes",
    "mem_fraction_static": "device.available_bytes (bytes for the KV cache, not a fraction)",
    "host_pool_bytes": "hisparse.host_pool_gib",
    "host_pool": "hisparse.host_pool_gib",
    "layout": "device.kv_cache_layout",
    "context_length": "model.max_model_len",
    "block_size": "layers[NAME].block_size",
    "page_size": "layers[NAME].block_size",
    "kv_cache_dtype": "layers[NAME].dtype (and cache_dtype)",
}
"""The CLI's and the engines' names for a request field, normalized (see `normal_key`)."""

REQUEST_SECTIONS: tuple[str, ...] = ("model", "device", "scheduler", "hisparse")


def normal_key(key: str) -> str:
    """`--gpu-mem`, `gpu-mem` and `GPU_MEM` all read as `gpu_mem`."""
    return key.strip().lstrip("-").replace("-", "_").lower()


def did_you_mean(key: str, spellings: Mapping[str, str], fields: Iterable[str]) -> str | None:
    """The field `key` most likely means: its known spelling, the same name after
    normalizing, or the closest field name; None when nothing is close."""
    wanted = normal_key(key)
    names = list(fields)
    if wanted in spellings:
        return spellings[wanted]
    if wanted in names and wanted != key:
        return wanted
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.75)
    return close[0] if close else None


def check_request_keys(data: Mapping[object, object]) -> None:
    """A request dict's top-level keys: one that is a CLI spelling, or a section's field put at
    the top, is a PlanError naming the field it should be; other unknown keys are left to
    validation."""
    top = set(PlanRequest.model_fields)
    inner = {
        name: f"{section}.{name}"
        for section in REQUEST_SECTIONS
        for name in _section_fields(section)
    }
    for key in data:
        if not isinstance(key, str) or key in top:
            continue
        hint = did_you_mean(key, REQUEST_SPELLINGS | inner, top)
        if hint is not None:
            raise PlanError(
                f"{key!r}: not a field of a plan request; did you mean {hint}? (expected "
                f"the request's sections: {', '.join(sorted(top))}; see "
                "docs/plan-contract.md)", field=key,
            )


def _section_fields(section: str) -> list[str]:
    annotation = PlanRequest.model_fields[section].annotation
    candidates = getattr(annotation, "__args__", (annotation,))
    for candidate in candidates:
        fields = getattr(candidate, "model_fields", None)
        if fields is not None:
            return list(fields)
    return []


def refuse_preset(value: object, where: str, expected: str, use: str = "{}") -> None:
    """A preset (what `load_preset` returns) where its architecture goes: say so, and what to
    pass (`use` with the architecture's expression in place of {})."""
    if hasattr(value, "architecture") and hasattr(value, "aliases"):
        name = getattr(value, "name", "?")
        instead = use.format(f"load_preset({name!r}).architecture")
        raise PlanError(
            f"{where}: expected {expected}, got the preset {name!r} ({type(value).__name__}); "
            f"pass {instead}", field=where,
        )


def refuse_path(value: object, where: str, what: str) -> None:
    """A path (a Path, or a string naming a file) where JSON text goes: say so."""
    if isinstance(value, os.PathLike) or (
        isinstance(value, str) and not value.lstrip().startswith(("{", "["))
        and (value.strip().endswith(".json") or os.path.isfile(value.strip()))
    ):
        raise PlanError(
            f"{where}: expected {what} or its JSON text, got a path ({os.fspath(value)!r}); "
            f"read the file first and pass its text to {where}", field=where,
        )


def request_argument(request: object, where: str) -> PlanRequest:
    """What a planner was given, as a validated request: a PlanRequest, its dict, or its JSON
    text (read strictly, as `load_json_object` reads any); a path, a preset and a CLI spelling
    of a field are PlanErrors saying what to pass instead; any other shape is pydantic's
    ValidationError."""
    if isinstance(request, PlanRequest):
        return request
    refuse_path(request, where, "a PlanRequest, its dict")
    refuse_preset(request, where, "a PlanRequest", "build_request({}) (hisparse_plan.presets)")
    if isinstance(request, str | bytes):
        request = load_json_object(request, what="request", max_depth=MAX_DEPTH)
    if isinstance(request, Mapping):
        check_request_keys(request)
    return PlanRequest.model_validate(request)
