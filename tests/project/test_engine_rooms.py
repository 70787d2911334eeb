"""Engine names stay in their rooms (docs/architecture.md#where-engine-names-may-appear): outside
targets/, adapters/, a module or package named for one engine (`torch/vllm/`, `cli/sglang/`,
`checking/sglang.py`, ...) and the per-engine registries, no code branches on an engine's name or
imports an engine's module; and no engine's module imports another engine's. Read from the code
(ast), not its prose: a docstring, a comment or a `Literal["vllm"]` field type names an engine
without branching on it."""

from __future__ import annotations

import ast

from support import paths

SRC = paths.REPO / "src" / "hisparse_plan"

ENGINES = frozenset({"vllm", "sglang"})

ROOMS = ("hisparse_plan.targets", "hisparse_plan.adapters")
"""Packages where every module may name an engine."""

REGISTRIES = frozenset({
    "hisparse_plan.checking.engines",
    "hisparse_plan.connectors.engines",
    "hisparse_plan.cli.engines",
    "hisparse_plan.exchange.transfer.facts.engines",
    "hisparse_plan.models.engines",
    "hisparse_plan.operator.engines",
    "hisparse_plan.torch.engines",
})
"""Each layer's one table of engines (targets/registry.py is inside targets/)."""



def engine_specific(module: str) -> bool:
    """Whether the module is one engine's: a part of its dotted name is named for the engine."""
    return any(part in ENGINES or part.startswith(tuple(f"{engine}_" for engine in ENGINES))
               for part in module.split("."))


def in_room(module: str) -> bool:
    """Whether `module` may name an engine."""
    return (engine_specific(module) or module in REGISTRIES
            or any(module == room or module.startswith(f"{room}.") for room in ROOMS))


def _prose(tree: ast.Module) -> set[int]:
    """The ids of string constants that name without branching: docstrings (a string
    statement) and the members of a `Literal[...]` type."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            found.add(id(node.value))
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id == "Literal"):
            found.update(id(inner) for inner in ast.walk(node.slice))
    return found


def _imported(node: ast.AST, package: str) -> list[str]:
    """The hisparse_plan modules (or names from them) that an import statement reads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parent, *([base] if base else [])])
    return [f"{base}.{alias.name}" for alias in node.names]


def findings(module: str, source: str, *, package: bool = False) -> list[str]:
    """Where the module's code names an engine: an engine's name as a value, or an import
    from an engine's module."""
    tree = ast.parse(source)
    prose = _prose(tree)
    here = module if package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value.lower() in ENGINES and id(node) not in prose):
            found.append((node.lineno, repr(node.value)))
        for name in _imported(node, here):
            if name.startswith("hisparse_plan") and engine_specific(name):
                found.append((getattr(node, "lineno", 0), f"import {name}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def engines_of(module: str) -> set[str]:
    """The engines a module's dotted name is named for."""
    return {engine for engine in ENGINES for part in module.split(".")
            if part == engine or part.startswith(f"{engine}_")}


def crossings(module: str, source: str, *, package: bool = False) -> list[str]:
    """The modules of another engine that one engine's module imports."""
    mine = engines_of(module)
    here = module if package else module.rpartition(".")[0]
    return [name for node in ast.walk(ast.parse(source)) for name in _imported(node, here)
            if name.startswith("hisparse_plan") and engines_of(name) - mine]


def _modules() -> dict[str, tuple[str, bool]]:
    """Every module in src/: dotted name -> (its source, whether it is a package)."""
    modules: dict[str, tuple[str, bool]] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = ["hisparse_plan", *path.relative_to(SRC).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return modules


def test_no_module_outside_the_rooms_names_an_engine() -> None:
    unexpected = {}
    for module, (source, package) in _modules().items():
        if in_room(module):
            continue
        found = findings(module, source, package=package)
        if found:
            unexpected[module] = found
    assert unexpected == {}


def test_no_engine_module_imports_another_engines() -> None:
    crossed = {module: found for module, (source, package) in _modules().items()
               if len(engines_of(module)) == 1
               and (found := crossings(module, source, package=package))}
    assert crossed == {}


def test_a_crossing_is_found() -> None:
    source = ("from hisparse_plan.cli.engines import Figures\n"
              "from hisparse_plan.cli.vllm.source import resolve_source\n"
              "from hisparse_plan.models.sglang_plan import SGLangPlan\n")
    assert crossings("hisparse_plan.cli.sglang.render", source) == [
        "hisparse_plan.cli.vllm.source.resolve_source"]


def test_the_scanner_sees_branches_and_imports_not_prose() -> None:
    source = '''"""Plans for vllm."""
from typing import Literal
from hisparse_plan.cli.sglang.source import resolve_sglang_source
from hisparse_plan.cli import vllm
from .sglang_render import summary
# sglang
Engine = Literal["vllm", "sglang"]
def pick(engine: str) -> int:
    """vllm or sglang."""
    return 1 if engine == "SGLang" else 2
'''
    assert findings("hisparse_plan.cli.commands.plan", source) == [
        "line 3: import hisparse_plan.cli.sglang.source.resolve_sglang_source",
        "line 4: import hisparse_plan.cli.vllm",
        "line 5: import hisparse_plan.cli.commands.sglang_render.summary",
        "line 10: 'SGLang'",
    ]


def test_each_registry_is_a_module_that_names_an_engine() -> None:
    modules = _modules()
    for registry in sorted(REGISTRIES):
        source, package = modules[registry]
        assert findings(registry, source, package=package), f"{registry} names no engine"


def test_the_rooms() -> None:
    assert in_room("hisparse_plan.cli.vllm.source")
    assert in_room("hisparse_plan.cli.sglang")
    assert in_room("hisparse_plan.checking.sglang_roles")
    assert in_room("hisparse_plan.targets.registry")
    assert in_room("hisparse_plan.cli.engines")
    assert not in_room("hisparse_plan.cli.commands.plan")
    assert not in_room("hisparse_plan.checking")
    assert not in_room("hisparse_plan.targetsx")
