"""Hostile inputs for every command that reads a file and every public loader, shared by
tests/project/test_hostile_inputs.py (outcomes) and benchmarks/bench_hostile_inputs.py (peak memory
and time): each input is written into a folder by `write_inputs`, one file per reader kind
where its shape matters (a request's, a plan's, a config's, a block list's unknown keys)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from support import paths

REPO: Final = paths.REPO
GOLDEN: Final = REPO / "tests" / "golden"
REQUEST: Final = GOLDEN / "bf16_small_with_full_attention.request.json"
CONFIG: Final = REPO / "tests" / "hf_configs" / "llama-3.1-8b-instruct" / "config.json"
KINDS: Final = ("request", "plan", "config", "blocks")
"""What a command reads: the shape an input takes for it."""


def good_request() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(REQUEST.read_text())
    return loaded


def good_plan() -> dict[str, Any]:
    import hisparse_plan as hp

    dumped: dict[str, Any] = hp.plan(good_request()).model_dump(mode="json")
    return dumped


def good_sglang_plan() -> dict[str, Any]:
    from hisparse_plan.adapters.sglang import request_from_server_args
    from hisparse_plan.targets.sglang import plan_sglang

    request = request_from_server_args(str(CONFIG), {"context_length": 4096},
                                       {"available_bytes": 2**30})
    dumped: dict[str, Any] = plan_sglang(request).model_dump(mode="json")
    return dumped


def good_of(kind: str) -> dict[str, Any]:
    if kind == "request":
        return good_request()
    if kind == "plan":
        return good_plan()
    if kind == "config":
        loaded: dict[str, Any] = json.loads(CONFIG.read_text())
        return loaded
    return {"num_tokens": 16, "source_blocks": {}, "destination_blocks": {}}


def many_layers_sglang_plan(layers: int, tensors: int = 1) -> dict[str, Any]:
    """An SGLang plan whose target pool claims `layers` layers (the issue's 10^6), in one
    tensor or spread evenly over `tensors` copies of it."""
    plan = good_sglang_plan()
    kv = next(tensor for tensor in plan["tensors"] if tensor["pool"] == "kv")
    share = layers // tensors
    copies = [{**kv, "layers": [f"model.layers.{i}.self_attn.attn"
                                for i in range(part * share, (part + 1) * share)]}
              for part in range(tensors)]
    plan["tensors"] = [tensor for tensor in plan["tensors"] if tensor is not kv] + copies
    return plan


def _with_keys(data: dict[str, Any], count: int) -> bytes:
    text = json.dumps(data, separators=(",", ":"))
    extra = ",".join(f'"k{i}":0' for i in range(count))
    return (text[:-1] + "," + extra + "}").encode()


def _deep(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


# Each input: kind -> file bytes (or a special path written by `write_inputs`).
Builder = Callable[[str, int], bytes]

BUILDERS: Final[dict[str, Builder]] = {
    "unknown keys": lambda kind, keys: _with_keys(good_of(kind), keys),
    "deep nesting": lambda kind, keys: _deep(100_000),
    "NaN": lambda kind, keys: json.dumps(_every_number(good_of(kind), float("nan"))).encode(),
    "2^70": lambda kind, keys: json.dumps(_every_number(good_of(kind), 2**70)).encode(),
    "non-UTF-8": lambda kind, keys: b'{"model_type": "\xff\xfe"}',
    "BOM": lambda kind, keys: b"\xef\xbb\xbf" + json.dumps(good_of(kind)).encode(),
}
SPECIAL: Final = ("FIFO", "/dev/zero", "1 GB file")


def _every_number(data: dict[str, Any], number: float) -> dict[str, Any]:
    """Every integer at the top level (and one level down) made `number`."""
    def counts(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def bump(value: Any) -> Any:
        if counts(value):
            return number
        if isinstance(value, dict):
            return {key: number if counts(item) else item for key, item in value.items()}
        return value
    return {key: bump(value) for key, value in data.items()}


def write_inputs(folder: Path, keys: int, layers: int) -> dict[tuple[str, str], str]:
    """(input, kind) -> path of every hostile input, written into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[tuple[str, str], str] = {}
    for name, build in BUILDERS.items():
        for kind in KINDS:
            path = folder / f"{name.replace(' ', '_').replace('^', '')}.{kind}.json"
            path.write_bytes(build(kind, keys))
            paths[name, kind] = str(path)
    fifo = folder / "fifo.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    huge = folder / "huge.json"
    with huge.open("wb") as handle:
        handle.truncate(2**30)
    layered = folder / "layers.plan.json"
    layered.write_text(json.dumps(many_layers_sglang_plan(layers)))
    spread = folder / "layers_spread.plan.json"
    spread.write_text(json.dumps(many_layers_sglang_plan(layers, tensors=10)))
    for kind in KINDS:
        paths["FIFO", kind] = str(fifo)
        paths["/dev/zero", kind] = "/dev/zero"
        paths["1 GB file", kind] = str(huge)
    paths["10^6-layer plan", "plan"] = str(layered)
    paths["10^6 layers, 10 tensors", "plan"] = str(spread)
    return paths


def commands(good: dict[str, str]) -> dict[str, tuple[str, Callable[[str], list[str]]]]:
    """Command name -> (the kind it reads, argv for a hostile file); `good` holds a sound
    plan's path ("plan") for the commands that read two files."""
    return {
        "plan --request": ("request", lambda p: ["plan", "--request", p]),
        "capacity --request": ("request", lambda p: ["capacity", "--request", p]),
        "tune --request": ("request", lambda p: ["tune", "--request", p, "--target", "1"]),
        "explain --request": ("request", lambda p: ["explain", "--request", p]),
        "verify --request": ("request", lambda p: ["verify", "--request", p]),
        "manifest --request": ("request", lambda p: ["manifest", "--request", p]),
        "plan --hf-config": ("config", lambda p: ["plan", "--hf-config", p]),
        "plan --engine sglang --hf-config": (
            "config", lambda p: ["plan", "--engine", "sglang", "--hf-config", p,
                                 "--gpu-mem", "1GiB"]),
        "diff": ("plan", lambda p: ["diff", p, good["plan"]]),
        "transfer": ("plan", lambda p: ["transfer", p, good["plan"]]),
        "transfer --blocks": ("blocks", lambda p: ["transfer", good["plan"], good["plan"],
                                                   "--blocks", p]),
    }


def loaders() -> dict[str, tuple[str, Callable[[str], object]]]:
    """Public loader name -> (the kind it reads, a call on a path's text)."""
    from hisparse_plan.exchange.transfer.program.transfer_program import TransferProgram
    from hisparse_plan.models import PlanRequest
    from hisparse_plan.models.any_plan import load_plan
    from hisparse_plan.presets.config_file import load_config_file

    def text(path: str) -> bytes:
        with open(path, "rb") as handle:  # the loaders take text; the CLI reads the file
            return handle.read(64 * 2**20 + 1)

    return {
        "load_plan": ("plan", lambda p: load_plan(text(p))),
        "PlanRequest.model_validate_json": (
            "request", lambda p: PlanRequest.model_validate_json(text(p))),
        "load_config_file": ("config", lambda p: load_config_file(p)),
        "TransferProgram.model_validate_json": (
            "blocks", lambda p: TransferProgram.model_validate_json(text(p))),
    }
