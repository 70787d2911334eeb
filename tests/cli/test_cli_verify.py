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
from hisparse_plan.cli import progress
from hisparse_plan.cli.commands import verify as verify_command
from support.cli_support import Run

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


class StubBackendError(Exception):
    """Not a PlanError: the backend's errors may become PlanError's siblings."""


class StubVerifyError(StubBackendError):
    pass


@pytest.fixture(params=["steps", "verify-only"])
def stub(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A stand-in `hisparse_plan.torch` that records how the CLI calls it, both as a backend
    whose allocate and verify report `progress(step, done, total)` ("steps") and as one whose
    verify alone reports `progress(done, total)` ("verify-only")."""
    calls: dict[str, Any] = {"kind": request.param}
    module = types.ModuleType("hisparse_plan.torch")

    class Pools:
        def __enter__(self) -> Pools:
            calls["entered"] = True
            return self

        def __exit__(self, *exc: object) -> None:
            calls["released"] = True

    def allocate_plain(plan: hp.KVCachePlan, *, device: str, pin: bool) -> Pools:
        calls.update(plan=plan, device=device, pin=pin)
        if calls.get("refuse"):
            raise StubBackendError("the host pool needs 9 GiB; 1 GiB is available")
        return Pools()

    def allocate_steps(
        plan: hp.KVCachePlan, *, device: str, pin: bool,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> Pools:
        calls["allocate_progress"] = progress
        if progress is not None:
            progress("prefault", 0, 2)
            progress("prefault", 2, 2)
        return allocate_plain(plan, device=device, pin=pin)

    def verify(
        plan: hp.KVCachePlan, pools: Pools, *, blocks: int | None,
        progress: Callable[..., None] | None = None,
    ) -> StubReport:
        calls["blocks"] = blocks
        calls["verify_progress"] = progress
        if calls.get("fail"):
            raise StubVerifyError("layer x block 3 byte 12: wrote 1, read 0")
        if progress is not None:
            for done in (1, 2):
                if request.param == "steps":
                    progress("verify", done, 2)
                else:
                    progress(done, 2)
        return StubReport(pages=10, bytes=4096, seconds=0.0)

    module.allocate = (  # type: ignore[attr-defined]
        allocate_steps if request.param == "steps" else allocate_plain
    )
    module.default_device = lambda: "cpu"  # type: ignore[attr-defined]
    module.verify = verify  # type: ignore[attr-defined]
    module.VerifyError = StubVerifyError  # type: ignore[attr-defined]
    module.BackendError = StubBackendError  # type: ignore[attr-defined]
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
    assert "host pool    1.02 MiB, pageable" in out
    assert "device pool  1 MiB on cpu" in out
    assert "pages" in out
    assert "4096" in out
    assert err == ""  # off a terminal: no progress
    assert stub["verify_progress"] is None


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


@pytest.mark.parametrize("renderer", ["rich", "lines"])
def test_verify_progress_on_a_terminal(
    cli: Run, stub: dict[str, Any], tiny: str, monkeypatch: pytest.MonkeyPatch, renderer: str
) -> None:
    if renderer == "rich":
        pytest.importorskip("rich")
    else:
        monkeypatch.setattr(progress, "rich_available", lambda: False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)  # every step counts as slow
    code, out, err = cli("verify", "--request", tiny, "--device", "cpu")
    assert code == 0, err
    assert "verified on cpu" in out
    assert stub["verify_progress"] is not None
    if stub["kind"] == "steps":
        assert stub["allocate_progress"] is not None
    if renderer == "lines":
        verify_lines = "\rverify: 1/2\rverify: 2/2\n"
        expected = ("\rprefault: 0/2\rprefault: 2/2\n" + verify_lines
                    if stub["kind"] == "steps" else verify_lines)
        assert err == expected
    else:  # a transient rich bar per step
        assert "verify" in err
        assert "2/2" in err
        assert ("prefault" in err) == (stub["kind"] == "steps")
    code, _, err = cli("verify", "--request", tiny, "--device", "cpu", "--quiet")
    assert (code, err) == (0, "")
    assert stub["verify_progress"] is None


def test_quick_steps_are_not_drawn() -> None:
    now = [0.0]
    drawn: list[tuple[str, int, int]] = []

    class Record:
        def update(self, step: str, done: int, total: int) -> None:
            drawn.append((step, done, total))

    report = progress.StepProgress(Record(), clock=lambda: now[0])
    report("register", 0, 3)
    now[0] = 0.5
    report("register", 3, 3)  # done in half a second: never drawn
    report("verify", 0, 4)
    now[0] = 1.0
    report("verify", 1, 4)  # still under a second into the step
    now[0] = 1.6
    report("verify", 2, 4)
    report(3, 4)  # an older backend's verify
    report("too", "many", "args", "here")  # ignored, never a failure
    assert drawn == [("verify", 2, 4), ("verify", 3, 4)]


def test_accepts_progress() -> None:
    def old(plan: object, *, device: str) -> None: ...
    def new(plan: object, *, progress: object = None) -> None: ...
    def loose(plan: object, **options: object) -> None: ...

    assert not progress.accepts_progress(old)
    assert progress.accepts_progress(new)
    assert progress.accepts_progress(loose)


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


def test_a_refused_verify_prints_one_line_and_nothing_before(
    cli: Run, stub: dict[str, Any], tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub["refuse"] = True
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # progress on: still one line
    code, out, err = cli("verify", "--request", tiny, "--device", "cpu")
    assert (code, out) == (2, "")
    assert err == "error: the host pool needs 9 GiB; 1 GiB is available\n"


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--device", "meta", "--pin"], "--pin cannot combine with --device meta"),
    (["--device", "meta", "--blocks", "4"], "--blocks cannot combine with --device meta"),
])
def test_flags_that_cannot_combine(
    cli: Run, stub: dict[str, Any], tiny: str, flags: list[str], fragment: str
) -> None:
    code, out, err = cli("verify", "--request", tiny, *flags)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {fragment}")
    assert len(err.splitlines()) == 1
    assert "plan" not in stub  # refused before anything was allocated


def test_ctrl_c_while_allocating_exits_130(
    cli: Run, stub: dict[str, Any], tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sys.modules["hisparse_plan.torch"], "allocate", interrupted)
    code, out, err = cli("verify", "--request", tiny, "--device", "cpu")
    assert (code, out, err) == (130, "", "error: interrupted\n")


@pytest.fixture
def pipeline(tmp_path: Path) -> str:
    """The Llama-3-70B pipeline golden case cut to eight layers: four 4 MiB stage pools."""
    from support.golden import load

    request = load("regular_llama3_70b_pp4_autofit")[0]
    names = [f"model.layers.{i}.self_attn.attn" for i in range(8)]
    request["layers"] = {name: request["layers"][names[0]] for name in names}
    request["model"]["max_model_len"] = 4096
    for index, stage in enumerate(request["device"]["pipeline_stages"]):
        stage["layers"] = names[2 * index:2 * index + 2]
        stage["available_bytes"] = (4 + index) * 2**20
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(request))
    return str(path)


@pytest.mark.parametrize(("flags", "message"), [
    ([], "the plan has 4 pipeline stages, each with its own device pool; pass --stage K "
         "(0 to 3) to verify one stage's pool"),
    (["--stage", "4"], "--stage 4: the plan has 4 pipeline stages; expected 0 to 3"),
    (["--device", "meta", "--stage", "7"],
     "--stage 7: the plan has 4 pipeline stages; expected 0 to 3"),
])
def test_a_pipeline_plan_needs_one_stage(
    cli: Run, stub: dict[str, Any], pipeline: str, flags: list[str], message: str
) -> None:
    code, out, err = cli("verify", "--request", pipeline, "--device", "cpu", *flags)
    assert (code, out, err) == (2, "", f"error: {message}\n")
    assert "plan" not in stub  # refused before anything was allocated


def test_stage_on_a_one_stage_plan(cli: Run, stub: dict[str, Any], tiny: str) -> None:
    code, out, err = cli("verify", "--request", tiny, "--device", "cpu", "--stage", "1")
    assert (code, out, err) == (2, "", "error: --stage 1: the plan has 1 pipeline stage; "
                                       "expected 0\n")
    code, _, err = cli("verify", "--request", tiny, "--device", "cpu", "--stage", "-1")
    assert code == 2
    assert "--stage" in err


def test_verify_one_pipeline_stage_for_real(cli: Run, pipeline: str) -> None:
    try:
        importlib.import_module("hisparse_plan.torch")
    except ImportError as error:
        pytest.skip(f"no torch backend here: {error}")
    code, out, err = cli("verify", "--request", pipeline, "--device", "cpu", "--no-pin",
                         "--stage", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["layers"], report["groups"], report["sampled"]) == (2, 1, False)
    code, out, err = cli("verify", "--request", pipeline, "--device", "cpu", "--no-pin",
                         "--stage", "3", "--plain")
    assert code == 0, err
    assert "device pool  4 MiB on cpu (pipeline stage 3)" in out
    assert "host pool    none" in out  # a regular plan has none
    code, out, err = cli("verify", "--request", pipeline, "--device", "meta", "--json")
    assert code == 0, err
    assert json.loads(out) == {"layers": 8, "host_bytes": 0, "device_bytes": 4 * 4 * 2**20,
                               "stage_bytes": [4 * 2**20] * 4}
    code, out, err = cli("verify", "--request", pipeline, "--device", "meta", "--stage", "1",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["stage_bytes"] == [4 * 2**20]
