"""`hisparse-plan verify`: the CLI around the torch backend, with a stand-in backend (always)
and with the real one on a plan of a few MiB (when torch and the backend import)."""

from __future__ import annotations

import importlib
import json
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hisparse_plan as hp
from cli_support import Run
from hisparse_plan.cli.commands import verify as verify_command

TINY_SPARSE = {"kind": "mla", "block_size": 16, "head_size": 64, "dtype": "bfloat16",
               "cache_role": "sparse", "is_index_group_leader": True}
TINY_INDEXER = {"kind": "mla", "block_size": 16, "head_size": 32, "dtype": "bfloat16",
                "cache_role": "indexer"}


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    """Two MLA layers: a ~1 MiB host pool and a 1 MiB device pool."""
    layers: dict[str, Any] = {}
    for i in range(2):
        layers[f"model.layers.{i}.self_attn.attn"] = TINY_SPARSE
        layers[f"model.layers.{i}.self_attn.indexer.k_cache"] = TINY_INDEXER
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({
        "layers": layers,
        "model": {"max_model_len": 256, "index_topk": 32},
        "hisparse": {"host_pool_gib": 0.001},
        "device": {"available_bytes": 2**20},
    }))
    return str(path)


@dataclass(frozen=True)
class StubReport:
    pages: int
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else float("inf")


class StubVerifyError(hp.PlanError):
    pass


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A stand-in `hisparse_plan.torch` that records how the CLI calls it."""
    calls: dict[str, Any] = {}
    module = types.ModuleType("hisparse_plan.torch")

    class Pools:
        def __enter__(self) -> Pools:
            calls["entered"] = True
            return self

        def __exit__(self, *exc: object) -> None:
            calls["released"] = True

    def allocate(plan: hp.KVCachePlan, *, device: str, pin: bool) -> Pools:
        calls.update(plan=plan, device=device, pin=pin)
        return Pools()

    def verify(
        plan: hp.KVCachePlan, pools: Pools, *, blocks: int | None,
        progress: Callable[[int, int], None] | None,
    ) -> StubReport:
        calls["blocks"] = blocks
        if calls.get("fail"):
            raise StubVerifyError("layer x block 3 byte 12: wrote 1, read 0")
        if progress is not None:
            progress(1, 2)
            progress(2, 2)
        return StubReport(pages=10, bytes=4096, seconds=0.0)

    module.allocate = allocate  # type: ignore[attr-defined]
    module.default_device = lambda: "cpu"  # type: ignore[attr-defined]
    module.verify = verify  # type: ignore[attr-defined]
    module.VerifyError = StubVerifyError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hisparse_plan.torch", module)
    return calls


def test_verify_calls_the_backend(cli: Run, stub: dict[str, Any], tiny: str) -> None:
    code, out, err = cli("verify", "--request", tiny, "--device", "cpu", "--blocks", "4")
    assert code == 0, err
    assert (stub["device"], stub["pin"], stub["blocks"]) == ("cpu", False, 4)
    assert stub["entered"]
    assert stub["released"]
    assert stub["plan"] == hp.plan(hp.PlanRequest.model_validate_json(Path(tiny).read_text()))
    assert "verified on cpu" in out
    assert "pages" in out
    assert "4096" in out
    assert err.startswith("verify: 1.02 MiB host pool (pageable), 1 MiB device pool on cpu")


def test_verify_json_and_pin_flags(cli: Run, stub: dict[str, Any], tiny: str) -> None:
    code, out, _ = cli("verify", "--request", tiny, "--device", "cuda:1", "--json")
    assert code == 0
    assert (stub["device"], stub["pin"], stub["blocks"]) == ("cuda:1", True, None)
    # seconds 0 makes the rate infinite, which JSON cannot hold: it comes out as null.
    assert json.loads(out) == {"pages": 10, "bytes": 4096, "seconds": 0.0, "gb_per_s": None}
    cli("verify", "--request", tiny, "--device", "cuda", "--no-pin")
    assert stub["pin"] is False


def test_verify_failure_exits_1(cli: Run, stub: dict[str, Any], tiny: str) -> None:
    stub["fail"] = True
    code, out, err = cli("verify", "--request", tiny, "--device", "cpu")
    assert code == 1
    assert out == ""
    assert err.splitlines()[-1] == (
        "error: verify failed: layer x block 3 byte 12: wrote 1, read 0")


def test_verify_progress_on_a_terminal(
    cli: Run, stub: dict[str, Any], tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verify_command, "rich_available", lambda: False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, _, err = cli("verify", "--request", tiny, "--device", "cpu")
    assert code == 0
    assert "\rverify: 1/2\rverify: 2/2\n" in err


def _no_module(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"No module named {name!r}", name=name)


def _wrapped_torch_error() -> ImportError:
    # What a backend raises when it checks for torch itself: the cause names the module.
    error = ImportError("hisparse_plan.torch needs PyTorch")
    error.__cause__ = _no_module("torch")
    return error


@pytest.mark.parametrize(("error", "fragment"), [
    (_no_module("torch"), "verify needs torch: pip install 'hisparse-plan[torch]'"),
    (_wrapped_torch_error(), "verify needs torch: pip install 'hisparse-plan[torch]'"),
    (_no_module("hisparse_plan.torch"),
     "verify needs the torch backend (hisparse_plan.torch), which this installation lacks"),
    (ImportError("libcudart.so.12: cannot open shared object file"),
     "the torch backend (hisparse_plan.torch) failed to import: libcudart.so.12"),
])
def test_verify_without_torch(
    cli: Run, tiny: str, monkeypatch: pytest.MonkeyPatch, error: ImportError, fragment: str
) -> None:
    def absent(name: str) -> types.ModuleType:
        raise error

    monkeypatch.setattr(verify_command, "import_module", absent)
    code, out, err = cli("verify", "--request", tiny)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {fragment}")
    assert len(err.splitlines()) == 1


def test_verify_bad_device(cli: Run, tiny: str) -> None:
    code, _, err = cli("verify", "--request", tiny, "--device", "tpu")
    assert code == 2
    assert err.startswith("error: argument --device: invalid device 'tpu'")


def test_verify_defaults_to_the_backends_device(
    cli: Run, stub: dict[str, Any], tiny: str
) -> None:
    code, _, err = cli("verify", "--request", tiny)
    assert code == 0, err
    assert (stub["device"], stub["pin"]) == ("cpu", False)


def test_verify_on_meta_binds_full_size_views(cli: Run) -> None:
    try:
        importlib.import_module("hisparse_plan.torch")
    except ImportError as error:
        pytest.skip(f"no torch backend here: {error}")
    code, out, err = cli("verify", "deepseek-v3.2", "--device", "meta", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report == {"layers": 244, "host_bytes": 68717395968, "device_bytes": 64424196096}


def test_verify_for_real(cli: Run, tiny: str) -> None:
    try:
        importlib.import_module("hisparse_plan.torch")
    except ImportError as error:
        pytest.skip(f"no torch backend here: {error}")
    code, out, err = cli("verify", "--request", tiny, "--device", "cpu", "--no-pin", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["pages"] > 0
    assert report["bytes"] > 0
