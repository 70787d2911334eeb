"""How the adapter types vLLM's objects.

vLLM is an optional dependency imported only at call time, and its classes carry no type
information this package can check against, so a vLLM object (a spec, a group, a config) is typed
as `VllmObject`.
"""

from __future__ import annotations

from typing import Any, TypeAlias

VllmObject: TypeAlias = Any
