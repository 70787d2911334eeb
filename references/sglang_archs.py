"""The architectures SGLang's ModelRegistry serves, read from SGLang's source without importing
it: every `EntryClass` of sglang/srt/models/*.py, as ``import_model_classes`` collects them on
a CUDA machine (importing the modules needs CUDA-only packages this machine lacks).

    /work/sglang/bin/python references/sglang_archs.py \\
        /work/sglang/lib/python3.11/site-packages/sglang/srt/models

prints one name a line; src/hisparse_plan/targets/sglang/served/registry.py holds its output.
sglang_reference.py refuses a case whose architecture is not among them, as SGLang's model
loader does."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _entry_names(tree: ast.Module) -> set[str]:
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    aliases = {
        n.targets[0].id: n.value.id
        for n in tree.body
        if isinstance(n, ast.Assign) and len(n.targets) == 1
        and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Name)
    }
    names: set[str] = set()
    for node in tree.body:
        if not (isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets)):
            continue
        items = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
        for item in items:
            if isinstance(item, ast.Name):
                name = item.id
                while name in aliases and name not in classes:
                    name = aliases[name]
                names.add(name)
    return names


def served_architectures(models_dir: Path) -> set[str]:
    """The EntryClass names of every module in `models_dir`."""
    names: set[str] = set()
    for path in sorted(models_dir.glob("*.py")):
        names |= _entry_names(ast.parse(path.read_text(encoding="utf-8")))
    return names


if __name__ == "__main__":
    for arch in sorted(served_architectures(Path(sys.argv[1]))):
        print(arch)
