"""Every hostile input on every command that reads a file, and on every public loader: one
`error:` line and exit 2 from a command, one PlanError or ValidationError from a loader
(issue 36). Sizes are smaller than benchmarks/bench_hostile_inputs.py's (200,000 unknown keys,
plans of 600,000 layers), which also measures peak memory and time; here only outcomes count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanError
from support.cli_support import Run
from support.hostile_inputs import BUILDERS, SPECIAL, commands, good_plan, loaders, write_inputs

KEYS, LAYERS = 200_000, 600_000  # past the 2^19 layer names a plan may hold
INPUTS = [*BUILDERS, *SPECIAL]
LAYERED = ("10^6-layer plan", "10^6 layers, 10 tensors")
COMMANDS = commands({})


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    folder = tmp_path_factory.mktemp("hostile")
    paths = write_inputs(folder, KEYS, LAYERS)
    plan = folder / "good.plan.json"
    plan.write_text(json.dumps(good_plan()))
    paths["good", "plan"] = str(plan)
    return paths


def _cases() -> list[tuple[str, str]]:
    found = [(name, command) for command in COMMANDS for name in INPUTS]
    found += [(name, command) for command, (kind, _) in COMMANDS.items() if kind == "plan"
              for name in LAYERED]
    return found


@pytest.mark.parametrize(("name", "command"), _cases())
def test_every_command_refuses_in_one_line(
    cli: Run, hostile: dict[tuple[str, str], str], name: str, command: str
) -> None:
    kind, argv = commands({"plan": hostile["good", "plan"]})[command]
    code, out, err = cli(*argv(hostile[name, kind]))
    lines = err.splitlines()
    assert (code, out, len(lines)) == (2, "", 1), (code, out[:200], err[:2000])
    assert lines[0].startswith("error: "), lines[0]
    assert "internal error" not in lines[0], lines[0]


@pytest.mark.parametrize(("name", "loader"), [
    (name, loader) for loader in loaders() for name in INPUTS
    if name != "FIFO" or loader == "load_config_file"
] + [(name, "load_plan") for name in LAYERED])
def test_every_loader_refuses_with_a_plan_or_validation_error(
    hostile: dict[tuple[str, str], str], name: str, loader: str
) -> None:
    kind, call = loaders()[loader]
    with pytest.raises((PlanError, ValidationError)):
        proved(loader, call(hostile[name, kind]))


def proved(loader: str, result: object) -> None:
    """A plan that parses is proved before anything reads it (check_plan)."""
    if loader == "load_plan":
        check_plan(result)  # type: ignore[arg-type]


def test_unknown_keys_are_named_and_counted(hostile: dict[tuple[str, str], str]) -> None:
    from hisparse_plan.models import PlanRequest

    text = Path(hostile["unknown keys", "request"]).read_bytes()
    with pytest.raises(ValidationError) as caught:
        PlanRequest.model_validate_json(text)
    assert caught.value.error_count() == 1
    message = str(caught.value)
    assert "unknown keys 'k0', 'k1', 'k2' and 199997 more" in message
