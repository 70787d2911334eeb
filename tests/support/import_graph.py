"""The package's import graph read from the source with ast, never by importing (see
tests/project/test_import_graph.py for what counts as an edge)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from support import paths

SRC = paths.REPO / "src"


PACKAGE = "hisparse_plan"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST, annotations: bool = False
             ) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth; those under `if TYPE_CHECKING:` only with
    `annotations`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if (not annotations and isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test)):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: dict[str, Path], annotations: bool = False
             ) -> set[str]:
    """The package's modules that the module `name` imports (with `annotations`, also those it
    imports for annotations only)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8")), annotations):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in known else base)
    return {target for target in targets if target in known and target != name}


@cache
def import_graph(annotations: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known, annotations) for name, path in known.items()}
