"""Runs the engine recipes (docs/recipe-vllm.md, docs/recipe-sglang.md) in their engines' venvs
and prints each one's output and PASS or FAIL; exits 1 if one fails.

    python references/run_recipes.py [--vllm-python PATH] [--sglang-python PATH]

Defaults: /work/vllm-venv/bin/python and /work/sglang/bin/python, or $VLLM_PYTHON and
$SGLANG_PYTHON. The project runs from this checkout's src (PYTHONPATH), never installed there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "references" / "recipes"


def recipe_command(engine: str, python: str) -> tuple[list[str], dict[str, str]]:
    """The command running `engine`'s recipe under `python`, and its environment."""
    paths = [str(REPO / "src")]
    if engine == "sglang":
        paths.append(str(REPO / "references" / "sglang_stubs"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONWARNINGS="ignore")
    return [python, str(RECIPES / f"{engine}_recipe.py")], env


def run(engine: str, python: str) -> bool:
    """Run one recipe; print its last lines and the verdict."""
    if not Path(python).exists():
        print(f"{engine}: SKIP (no interpreter at {python})")
        return True
    command, env = recipe_command(engine, python)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    ours = [line for line in done.stdout.splitlines() if line.strip()]
    print(f"== {engine} ({python})")
    print("\n".join(ours))
    if done.returncode != 0:
        print(done.stderr[-3000:])
    passed = done.returncode == 0 and bool(ours) and ours[-1] == "PASS"
    print(f"{engine}: {'PASS' if passed else 'FAIL'}")
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python",
                        default=os.environ.get("VLLM_PYTHON", "/work/vllm-venv/bin/python"))
    parser.add_argument("--sglang-python",
                        default=os.environ.get("SGLANG_PYTHON", "/work/sglang/bin/python"))
    args = parser.parse_args()
    results = [run("vllm", args.vllm_python), run("sglang", args.sglang_python)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
