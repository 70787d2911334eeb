"""Import stubs for running SGLang 0.5.23's own pool code on a CPU-only machine.

With this folder on PYTHONPATH, Python imports this module at start-up. It serves a
permissive stand-in for each package in `STUBBED` (today only torchvision, whose PyPI wheel
cannot load beside the CPU build of torch 2.13; SGLang imports it while reading configs and
never calls it for pool sizing). Any attribute of a stand-in is another stand-in, and calling
one returns a stand-in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

STUBBED = {"torchvision": "0.28.0"}
"""Stubbed package -> the version it claims."""


class Placeholder:
    """Whatever a stubbed module hands out: callable, subscriptable, any attribute."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:  # noqa: ANN401
        return Placeholder(f"{self._name}()")

    def __getitem__(self, key: object) -> Placeholder:
        return Placeholder(f"{self._name}[]")

    def __repr__(self) -> str:
        return f"<stub {self._name}>"

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)  # a class that subclasses a stubbed one still builds


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # a package, so that its submodules are stubbed too
        module.__file__ = "<stub>"
        version = STUBBED.get(spec.name)
        if version is not None:
            module.__version__ = version  # type: ignore[attr-defined]

        def attribute(name: str) -> Placeholder:
            if name.startswith("__"):
                raise AttributeError(name)
            return Placeholder(f"{spec.name}.{name}")

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


sys.meta_path.insert(0, _StubFinder())
