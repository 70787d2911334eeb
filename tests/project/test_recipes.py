"""The engine recipes: each docs page shows its script exactly as the repository keeps it, and
each script runs where its engine is installed (skipped elsewhere, as in CI)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.doc_examples import REPO, blocks

RECIPES = {
    "vllm": (REPO / "docs" / "recipe-vllm.md", REPO / "references" / "recipes" / "vllm_recipe.py"),
    "sglang": (REPO / "docs" / "recipe-sglang.md",
               REPO / "references" / "recipes" / "sglang_recipe.py"),
}


@pytest.mark.parametrize("engine", RECIPES)
def test_the_page_shows_the_script_as_kept(engine: str) -> None:
    page, script = RECIPES[engine]
    shown = [block for block in blocks(page) if block.kind == "python"]
    assert len(shown) == 1, f"{page.name}: expected one python block, the recipe"
    body = "\n".join(shown[0].body) + "\n"
    assert body == script.read_text(encoding="utf-8"), (
        f"{page.name} no longer shows {script.name}: paste the script into the page")


def test_a_changed_script_is_caught() -> None:
    """The comparison above is not vacuous: one changed line makes the texts differ."""
    page, script = RECIPES["vllm"]
    body = "\n".join(next(b for b in blocks(page) if b.kind == "python").body) + "\n"
    assert body.replace("PASS", "FAIL") != script.read_text(encoding="utf-8")


@pytest.mark.parametrize("engine", RECIPES)
def test_the_recipe_runs_in_its_engine(engine: str) -> None:
    pytest.importorskip(engine)
    _, script = RECIPES[engine]
    paths = [str(REPO / "src")]
    if engine == "sglang":
        paths.append(str(REPO / "references" / "sglang_stubs"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "PASS"
