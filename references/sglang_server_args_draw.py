"""Random values of the ServerArgs fields the planner accepts and ignores, for
`sglang_diff.py --server-args-fields`: each case gains a few fields beyond the modelled ones, and
SGLang's report must not move (or both sides refuse).

The fields are the project's table (hisparse_plan.adapters.sglang.server_args_table) less those
it models or refuses unless at SGLang's default; their values come from SGLang's own command
line (``ServerArgs.add_cli_args``): a flag set, a boolean flipped, another of its choices, an
integer or float near its default. Fields whose value is free text (paths, URLs, JSON, keys)
or a list, and fields with no command-line flag, are not drawn (`undrawable` says which). Needs
SGLang in this interpreter."""

from __future__ import annotations

import argparse
import importlib
import random
from typing import Any

SKIPPED: dict[str, str] = {
    "ep_size": "SGLang checks it against its resolved MoE topology (tp_size, moe_dp_size, "
               "attn_cp_size, the all-to-all backend: arg_groups/parallel_hook.py), which the "
               "planner does not mirror",
}
"""Ignored fields left out of the draw, and why. The fields SGLang's argument checks refuse
alone are drawn: the planner refuses them as SGLang does (adapters/sglang/
server_args_checks.py). A field SGLang refuses for a package this host lacks is drawn too, and
its case counted as unusable here (sglang_diff.UNUSABLE_HERE)."""
SKIPPED_VALUES: dict[str, tuple[Any, ...]] = {}
"""Values left out of a field's draw, for the same reason."""

_CACHE: dict[str, Any] = {}


def _actions() -> dict[str, argparse.Action]:
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    return {action.dest: action for action in parser._actions}


def _values(action: argparse.Action, default: object) -> list[Any]:
    """Values of a flag other than its default, as SGLang's command line gives them."""
    kind = type(action).__name__
    if kind.startswith("Deprecated") or action.nargs not in (None, 0):
        return []
    if kind == "_StoreTrueAction":
        return [True] if default is not True else []
    if kind == "_StoreFalseAction":
        return [False] if default is not False else []
    if kind == "BooleanOptionalAction":
        return [v for v in (True, False) if v != default]
    if action.choices is not None:
        return [c for c in action.choices if c != default and c is not None]
    if action.type is int:
        base = default if isinstance(default, int) and not isinstance(default, bool) else 0
        return sorted({v for v in (base + 1, 2 * base, 8) if v > 0 and v != default})
    if action.type is float:
        low = float(default) if isinstance(default, float | int) else 0.0
        return [v for v in (low * 0.5, low * 2, 0.25) if v > 0 and v != default]
    return []


def drawable_fields() -> tuple[dict[str, list[Any]], dict[str, str]]:
    """({field: values to draw}, {field: why it is not drawn}) over the ignored fields."""
    if "fields" in _CACHE:
        return _CACHE["fields"], _CACHE["undrawable"]
    from hisparse_plan.adapters.sglang.request import MODELLED
    from hisparse_plan.adapters.sglang.server_args_table import SERVER_ARGS_FIELDS, UNPLANNED

    actions = _actions()
    fields: dict[str, list[Any]] = {}
    undrawable: dict[str, str] = {}
    for name, entry in SERVER_ARGS_FIELDS.items():
        if name in MODELLED or name in UNPLANNED:
            continue
        if name in SKIPPED:
            undrawable[name] = SKIPPED[name]
            continue
        action = actions.get(name)
        if action is None:
            undrawable[name] = "no command-line flag"
            continue
        values = [value for value in _values(action, entry.get("default"))
                  if value not in SKIPPED_VALUES.get(name, ())]
        if values:
            fields[name] = values
        else:
            undrawable[name] = "free text, a list, or no other value"
    _CACHE["fields"], _CACHE["undrawable"] = fields, undrawable
    return fields, undrawable


def draw_fields(rng: random.Random, case: dict[str, Any], most: int = 3) -> list[str]:
    """Add 1..`most` ignored fields with drawn values to the case's server_args; their names."""
    fields, _ = drawable_fields()
    args = case["server_args"]
    names = rng.sample(sorted(fields), rng.randint(1, most))
    for name in names:
        args[name] = rng.choice(fields[name])
    return names
