"""Modules that moved still import from their old paths: the same module object, with a
DeprecationWarning that names the new path, while the package's own imports raise none."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

VLLM = "hisparse_plan.targets.vllm"
MOVED: dict[str, str] = {
    **{f"hisparse_plan.planning.{name}": f"{VLLM}.{name}" for name in (
        "admit", "groups", "hisparse_groups", "host_pool", "one_manager", "packed", "pipeline",
        "place", "regular_groups", "size", "unified")},
    "hisparse_plan.planning.trace": "hisparse_plan.targets.trace",
    **{f"hisparse_plan.rules.{name}": f"{VLLM}.rules.{name}" for name in (
        "block_bytes", "buckets", "capacity", "families", "host", "hot", "pages", "pool_memory",
        "promotion", "required", "uniform_spec", "window_merges")},
}
"""Old module path -> where it lives now."""

# One fresh interpreter for all of them: a module warns only the first time it is imported.
PROBE = """
import json, sys, warnings
moved = json.loads(sys.argv[1])
out = {}

def warned():
    return [(w.category.__name__, str(w.message), w.filename) for w in caught]

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import hisparse_plan, hisparse_plan.checking, hisparse_plan.cli.main, hisparse_plan.operator
    out["own imports"] = warned()
    del caught[:]
    from hisparse_plan.planning import plan_traced  # the package first: it warns once
    out["planning"] = [plan_traced is hisparse_plan.targets.vllm.plan_traced, warned()]
    for old, new in moved.items():
        del caught[:]
        exec(f"import {old}")  # as a caller writes it
        out[old] = [sys.modules[old] is sys.modules[new], warned()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probed() -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(MOVED)], capture_output=True,
                            text=True, check=True)
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_the_package_imports_no_old_path(probed: dict[str, Any]) -> None:
    assert probed["own imports"] == []


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_and_warns_its_importer(
    old: str, probed: dict[str, Any]
) -> None:
    same, warned = probed[old]
    assert same, old
    assert warned == [["DeprecationWarning", f"{old} moved to {MOVED[old]}; import it from there",
                       "<string>"]]


def test_the_old_planning_package_reexports_the_planner(probed: dict[str, Any]) -> None:
    same, warned = probed["planning"]
    assert same
    assert [message for _, message, _ in warned] == [
        f"hisparse_plan.planning moved to {VLLM}; import it from there"]


def test_reading_hp_planning_warns_once_at_the_reader() -> None:
    code = ("import warnings, hisparse_plan as hp\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    traced = hp.planning.plan_traced\n"
            "print(traced is hp.targets.vllm.plan_traced, len(caught), caught[0].lineno,\n"
            "      caught[0].filename, caught[0].category.__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["True", "1", "4", "<string>", "DeprecationWarning"]
