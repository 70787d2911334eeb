"""Old import paths of modules that moved (docs/architecture.md#old-import-paths): each still
imports, with a DeprecationWarning naming the new path. Code in this package imports only the
new paths."""

from __future__ import annotations

import sys
import warnings


def deprecated_path(old: str, new: str, *, depth: int = 0) -> None:
    """Warn whoever imported `old` (the module calling this, `depth` calls up) that it now
    lives at `new`."""
    # Past this function and the old module to the importer's line; warnings itself skips the
    # import machinery's frames.
    warnings.warn(f"{old} moved to {new}; import it from there", DeprecationWarning,
                  stacklevel=3 + depth)


def moved(old: str, new: str) -> None:
    """Make the module `old` the module `new` (imported already): one module under two names,
    so that what a caller reads or patches through the old name is what the planner runs."""
    deprecated_path(old, new, depth=1)
    sys.modules[old] = sys.modules[new]
