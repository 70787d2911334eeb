"""The package's modules import each other in one direction (no cycle, and each room only the
rooms docs/architecture.md lists for it), and none grows past 400 lines.

The graph is read from the source with `ast`, never by importing. A module's edges are the
modules of this package it imports: `import a.b`, `from a import b` (to the submodule `a.b` when
there is one, else to `a`) and relative imports, at module level and inside functions alike: an
import deferred into a function is still a dependency, and deferring one is how a cycle hides.
Left out: imports under `if TYPE_CHECKING:` (names for annotations, nothing runs), modules
imported by a string (`importlib.import_module`, as the target registry does), and the implicit
import of a package's `__init__` that importing one of its submodules causes (every package
that re-exports its submodules would otherwise be a cycle).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

from support.import_graph import PACKAGE, SRC, import_graph, imported, modules

MAX_LINES = 400

KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()
"""Cycles that exist today and are someone's named job; any other cycle fails."""

KNOWN_LONG: frozenset[str] = frozenset()
"""Modules over MAX_LINES today, each split by a named later change; any other fails."""


BASE = frozenset({"errors", "rule_docs"})
"""Modules every room may import."""
TARGET = "targets.*"
"""Any engine's target package (`targets/vllm/`, `targets/sglang/`, ...)."""
MAY_IMPORT: dict[str, frozenset[str]] = {
    "models": frozenset(),
    "rules": frozenset({"models"}),
    "targets": frozenset({"models"}),  # the registry and the trace
    TARGET: frozenset({"models", "rules", "targets"}),  # never another target
    "views": frozenset({"models", "rules"}),
    "checking": frozenset({"models", "rules", "views", "targets", TARGET}),
    "exchange": frozenset({"models", "views", "checking"}),
    "presets": frozenset({"models"}),
    "operator": frozenset({"models", "presets", "checking", "targets", TARGET}),
    "adapters": frozenset({"models", "presets", "rules", "checking", "targets", TARGET,
                           "torch"}),
    # torch posts exchange's transfer programs between tensors (torch/transfer.py).
    "torch": frozenset({"models", "rules", "views", "checking", "exchange"}),
    # connectors put proved patterns inside serving engines (docs/connector.md).
    "connectors": frozenset({"models", "rules", "views", "checking", "exchange", "targets",
                             TARGET, "adapters", "torch", "presets"}),
}
"""docs/architecture.md's table: the rooms each room may import (cli and the package's own
`__init__` may import any)."""


ENGINES = frozenset(path.parent.name for path in (SRC / PACKAGE / "targets").glob("*/__init__.py"))
"""The target packages under targets/."""


def room(module: str) -> str:
    """The room a module belongs to: its top-level package, or for a target `targets.<engine>`."""
    parts = module.split(".")[1:]
    if not parts:
        return PACKAGE
    if parts[0] == "targets" and len(parts) > 1 and parts[1] in ENGINES:
        return f"targets.{parts[1]}"
    return parts[0]


def kind(room_name: str) -> str:
    """A room as MAY_IMPORT names it: every target is TARGET."""
    return TARGET if room_name.removeprefix("targets.") in ENGINES else room_name










def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for child in edges:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def one_cycle(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself."""
    start = min(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & component):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def test_the_walker_sees_from_and_deferred_imports_not_annotation_ones() -> None:
    graph = import_graph()
    # A module-level `from package import name`, to the package itself:
    assert "hisparse_plan.models" in graph["hisparse_plan.views"]
    # A function-level import (the SGLang adapter imports its target only when asked):
    assert "hisparse_plan.targets.sglang" in graph["hisparse_plan.adapters.sglang"]
    # `from a.b import c` to the submodule a.b.c:
    assert "hisparse_plan.targets.vllm.pipeline" in graph["hisparse_plan.targets.vllm"]
    # Not the names for annotations only, unless asked for:
    assert "hisparse_plan.operator.refit" not in graph["hisparse_plan"]
    assert "hisparse_plan.operator.refit" in import_graph(annotations=True)["hisparse_plan"]


def test_the_walker_resolves_relative_imports(tmp_path: Path) -> None:
    module = tmp_path / "c.py"
    module.write_text("from . import d\nfrom .. import e\nfrom ..f import g\n"
                      "def later():\n    from .d import h\n")
    known = dict.fromkeys(["p.q.c", "p.q.d", "p.e", "p.f", "p.f.g"], module)
    assert imported("p.q.c", module, known) == {"p.q.d", "p.e", "p.f.g"}


def test_the_cycle_finder_names_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert one_cycle(graph, frozenset({"a", "b", "c"})) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("annotations", [False, True], ids=["runtime", "with-annotations"])
def test_no_import_cycle(annotations: bool) -> None:
    """No cycle at run time, and none once the imports made for annotations only count too (a
    cycle hidden under TYPE_CHECKING is still two modules that cannot be read apart)."""
    graph = import_graph(annotations)
    new = [component for component in cycles(graph) if component not in KNOWN_CYCLES]
    assert not new, "import cycles: " + "; ".join(
        " -> ".join(one_cycle(graph, component)) for component in new)


@pytest.mark.parametrize("cycle", sorted(sorted(known) for known in KNOWN_CYCLES),
                         ids=lambda names: names[0])
def test_a_known_cycle_is_still_there(cycle: list[str]) -> None:
    assert frozenset(cycle) in cycles(import_graph()), f"{cycle} is gone: remove it from the list"


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a room that its room may not import, as "module -> module"."""
    shims = {name for name, edges in graph.items() if f"{PACKAGE}._moved" in edges}
    wrong = []
    for name, edges in sorted(graph.items()):
        allowed = MAY_IMPORT.get(kind(room(name)))
        if name in shims or allowed is None:
            continue  # an old path importing its new home; cli/ and the package itself
        wrong += [f"{name} -> {edge}" for edge in sorted(edges)
                  if room(edge) != room(name) and kind(room(edge)) not in allowed | BASE]
    return wrong


SGLANG = f"{PACKAGE}.targets.sglang"
SGLANG_STAGES = frozenset({"pipeline", "read", "resolve", "size", "place", "report"})
"""The SGLang target's stages (and `pipeline.py`, which runs them), at its top."""
SGLANG_CONCERNS: dict[str, frozenset[str]] = {
    "modes": frozenset(),
    "hisparse": frozenset(),
    "served": frozenset(),
    "deepseek_v4": frozenset({"modes"}),
}
"""docs/architecture.md: each of SGLang's concerns (a subpackage) and the other concerns it may
import; each may import the top's rules, none a stage."""


def sglang_part(module: str) -> str | None:
    """Where a module of the SGLang target sits: a concern's name, "stage", "rule" (the other
    modules at the top) or "package" (its `__init__`); None outside the target."""
    if module == SGLANG:
        return "package"
    if not module.startswith(f"{SGLANG}."):
        return None
    parts = module.removeprefix(f"{SGLANG}.").split(".")
    if parts[0] in SGLANG_CONCERNS:
        return parts[0]
    return "stage" if parts[0] in SGLANG_STAGES else "rule"


def sglang_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of an SGLang concern that docs/architecture.md does not allow it."""
    wrong = []
    for name, edges in sorted(graph.items()):
        part = sglang_part(name)
        if part not in SGLANG_CONCERNS:
            continue
        allowed = {part, "rule", *SGLANG_CONCERNS[part]}
        wrong += [f"{name} -> {edge}" for edge in sorted(edges)
                  if sglang_part(edge) not in allowed and sglang_part(edge) is not None]
    return wrong


def test_sglang_concerns_import_the_top_rules_never_a_stage() -> None:
    assert set(SGLANG_CONCERNS) == {path.parent.name for path in
                                    (SRC / PACKAGE / "targets" / "sglang").glob("*/__init__.py")}
    assert sglang_violations(import_graph()) == []


def test_an_sglang_concern_importing_a_stage_or_another_concern_is_found() -> None:
    graph = {
        f"{SGLANG}.modes.radix": {f"{SGLANG}.sizing", f"{SGLANG}.size", f"{SGLANG}.served.llama4"},
        f"{SGLANG}.deepseek_v4.model": {f"{SGLANG}.model", f"{SGLANG}.modes.parallel",
                                        f"{PACKAGE}.models"},
        f"{SGLANG}.size": {f"{SGLANG}.modes.radix"},
    }
    assert sglang_violations(graph) == [
        f"{SGLANG}.modes.radix -> {SGLANG}.served.llama4",
        f"{SGLANG}.modes.radix -> {SGLANG}.size",
    ]


def test_each_room_imports_only_the_rooms_it_may() -> None:
    assert room_violations(import_graph()) == []


def test_a_target_importing_another_or_models_importing_rules_is_found() -> None:
    graph = {
        "hisparse_plan.targets.vllm.pipeline": {"hisparse_plan.targets.sglang.sizing",
                                                "hisparse_plan.targets.trace",
                                                "hisparse_plan.targets.vllm.rules.hot"},
        "hisparse_plan.models.plan": {"hisparse_plan.rules.arith", "hisparse_plan.errors"},
        "hisparse_plan.checking.meaning": {"hisparse_plan.targets.vllm.rules.hot"},
        "hisparse_plan.cli.main": {"hisparse_plan.torch"},
    }
    assert room_violations(graph) == [
        "hisparse_plan.models.plan -> hisparse_plan.rules.arith",
        "hisparse_plan.targets.vllm.pipeline -> hisparse_plan.targets.sglang.sizing",
    ]


def test_each_target_is_a_room_of_its_own() -> None:
    assert {"vllm", "sglang"} <= ENGINES
    assert room("hisparse_plan.targets.vllm.rules.hot") == room("hisparse_plan.targets.vllm")
    assert room("hisparse_plan.targets.vllm") != room("hisparse_plan.targets.sglang.planner")
    assert kind(room("hisparse_plan.targets.sglang")) == TARGET
    assert room("hisparse_plan.targets.registry") == room("hisparse_plan.targets.trace")
    assert kind(room("hisparse_plan.targets.trace")) == "targets"


def test_no_module_over_400_lines() -> None:
    lengths = {str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
               for path in modules().values()}
    long = {name for name, lines in lengths.items() if lines > MAX_LINES}
    assert long <= KNOWN_LONG, {name: lengths[name] for name in long - KNOWN_LONG}
    assert long >= KNOWN_LONG, f"{sorted(KNOWN_LONG - long)} fit now: remove them from the list"


def test_each_package_says_in_two_lines_what_it_holds_and_may_import() -> None:
    """A package's `__init__` docstring opens with two lines: what it holds, and what it may
    import (the rooms above, or nothing)."""
    wrong = {}
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        opening = doc.split("\n\n")[0].splitlines()
        if len(opening) != 2 or "import" not in opening[1]:
            wrong[name] = opening
    assert wrong == {}


TRANSFER = f"{PACKAGE}.exchange.transfer"
TRANSFER_MAY_IMPORT: dict[str, frozenset[str]] = {
    "facts": frozenset(),
    "program": frozenset({"facts"}),
    "proof": frozenset({"facts", "program"}),
    "pattern": frozenset({"facts", "program", "proof"}),
    "executors": frozenset({"program", "pattern"}),
}
"""The transfer's rooms (its `__init__` says so): facts below the program below the proof, the
pattern on all three, the executors on the program and the pattern, nothing back up. Every room
may import the transfer's `errors`."""


def transfer_part(module: str) -> str | None:
    """The transfer room a module sits in; "base" for errors.py, "package" for the
    package's `__init__`; None outside the transfer."""
    if module == TRANSFER:
        return "package"
    if not module.startswith(f"{TRANSFER}."):
        return None
    first = module.removeprefix(f"{TRANSFER}.").split(".")[0]
    return first if first in TRANSFER_MAY_IMPORT else "base"


def transfer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import inside the transfer that its layering does not allow."""
    wrong = []
    for name, edges in sorted(graph.items()):
        part = transfer_part(name)
        if part not in TRANSFER_MAY_IMPORT:
            continue
        allowed = {part, "base", *TRANSFER_MAY_IMPORT[part]}
        wrong += [f"{name} -> {edge}" for edge in sorted(edges)
                  if transfer_part(edge) is not None and transfer_part(edge) not in allowed]
    return wrong


def test_the_transfer_is_layered_facts_program_proof_pattern_executors() -> None:
    found = {path.parent.name for path in (SRC / PACKAGE / "exchange" / "transfer")
             .glob("*/__init__.py")}
    assert found == set(TRANSFER_MAY_IMPORT)
    assert {path.stem for path in (SRC / PACKAGE / "exchange" / "transfer").glob("*.py")} == {
        "__init__", "errors"}
    assert transfer_violations(import_graph(annotations=True)) == []


def test_a_transfer_import_back_up_is_found() -> None:
    graph = {
        f"{TRANSFER}.facts.side": {f"{TRANSFER}.program.match", f"{TRANSFER}.errors"},
        f"{TRANSFER}.program.build": {f"{TRANSFER}.facts.side"},
        f"{TRANSFER}.executors.reference": {f"{TRANSFER}.proof.check", f"{TRANSFER}"},
        f"{TRANSFER}.pattern.instance": {f"{TRANSFER}.proof.check",
                                         f"{TRANSFER}.executors.reference"},
    }
    assert transfer_violations(graph) == [
        f"{TRANSFER}.executors.reference -> {TRANSFER}",
        f"{TRANSFER}.executors.reference -> {TRANSFER}.proof.check",
        f"{TRANSFER}.facts.side -> {TRANSFER}.program.match",
        f"{TRANSFER}.pattern.instance -> {TRANSFER}.executors.reference",
    ]
