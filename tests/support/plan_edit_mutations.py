"""Random single edits of a plan's JSON: a number, a name, a literal, a flag or a list changed in
one place (or one pool renamed wherever it is named). The plan's dict is never changed: an edit
copies the containers on its path."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hisparse_plan.models.layout import KVCacheLayout
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE
from support.plan_edit_oracle_sglang_modes import extra_columns

Key = str | int
Path = tuple[Key, ...]

LITERALS: dict[str, list[Any]] = {
    "location": ["device", "host"],
    "allocation": ["whole", "per_layer"],
    "dtype": sorted(BUFFER_DTYPE_SIZE),
    "layout": [layout.value for layout in KVCacheLayout],
    "kind": ["mla", "full_attention", "sliding_window", "chunked_local_attention",
             "sliding_window_mla", "mamba", "uniform_type", "hisparse_resident",
             "hisparse_hot"],
    "role": ["default", "hisparse_source", "hisparse_indexer"],
    "cache_role": ["sparse", "indexer"],
    "mamba_cache_mode": ["none", "align"],
    "engine": ["vllm", "sglang"],
}
BIG_INTS = [2**31, 2**32 + 1, 2**62, 2**63 - 1, 2**63, -1]
ODD_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.5, 1e-9, 1.0, 1.5, 1e300]


@dataclass(frozen=True, slots=True)
class Edit:
    path: str
    """Where, as `tensors[0].views[1].strides[0]`."""
    kind: str
    """What: `+1`, `x2`, `drop`, `rename pool`, ..."""
    old: object
    new: object

    @property
    def field(self) -> str:
        """The path with list indices as [*]: what the report counts by."""
        parts = []
        for part in self.path.split("."):
            parts.append(part.split("[", 1)[0] + ("[*]" * part.count("[")))
        return ".".join(parts)

    def __str__(self) -> str:
        return f"{self.path} {self.kind}: {_short(self.old)} -> {_short(self.new)}"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def show(path: Path) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    return text


@dataclass(frozen=True, slots=True)
class Sites:
    """Every place an edit can land in one plan's JSON."""

    numbers: list[Path]
    strings: list[Path]
    flags: list[Path]
    """bools and nulls"""
    lists: list[Path]
    keys: list[Path]
    """dict entries that may be dropped"""
    ints: list[int]
    floats: list[float]
    texts: list[str]
    pools: list[str]


def sites(root: dict[str, Any]) -> Sites:
    found = Sites([], [], [], [], [], [], [], [], [])
    _walk(root, (), found)
    found.pools.extend(pool["name"] for pool in root.get("pools", []))
    return found


def _walk(node: Any, path: Path, found: Sites) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            found.keys.append((*path, key))
            _walk(value, (*path, key), found)
    elif isinstance(node, list):
        if node:
            found.lists.append(path)
        for index, value in enumerate(node):
            _walk(value, (*path, index), found)
    elif isinstance(node, bool) or node is None:
        found.flags.append(path)
    elif isinstance(node, int):
        found.numbers.append(path)
        found.ints.append(node)
    elif isinstance(node, float):
        found.numbers.append(path)
        found.floats.append(node)
    elif isinstance(node, str):
        found.strings.append(path)
        found.texts.append(node)


def get(root: Any, path: Path) -> Any:
    for key in path:
        root = root[key]
    return root


def edited(root: dict[str, Any], path: Path, change: Callable[[Any, Key], None]) -> dict[str, Any]:
    """A copy of `root` with `change(container, key)` applied at `path`; only the containers
    on the path are copied."""
    top: dict[str, Any] = dict(root)
    node: Any = top
    for key in path[:-1]:
        child = node[key]
        copied = dict(child) if isinstance(child, dict) else list(child)
        node[key] = copied
        node = copied
    change(node, path[-1])
    return top


def _set(value: Any) -> Callable[[Any, Key], None]:
    def change(container: Any, key: Key) -> None:
        container[key] = value

    return change


def _new_int(rng: random.Random, old: int, found: Sites) -> tuple[str, int]:
    choice = rng.randrange(11)
    if choice == 0:
        return "+1", old + 1
    if choice == 1:
        return "-1", old - 1
    if choice == 2:
        return "x2", old * 2
    if choice == 3:
        return "/2", old // 2
    if choice == 4:
        return "0", 0
    if choice == 5:
        return "random", rng.randint(0, 2 * abs(old) + 16)
    if choice == 6:
        return "big", rng.choice(BIG_INTS)
    if choice == 7:
        return "+other", old + rng.choice(found.ints)
    if choice == 8:
        return "-other", old - rng.choice(found.ints)
    return "other", rng.choice(found.ints)


def _new_float(rng: random.Random, old: float, found: Sites) -> tuple[str, float]:
    choice = rng.randrange(7)
    if choice == 0:
        return "x2", old * 2
    if choice == 1:
        return "/2", old / 2
    if choice == 2:
        return "+1", old + 1
    if choice == 3:
        return "-1", old - 1
    if choice == 4:
        return "-x", -old
    if choice == 5:
        return "odd", rng.choice(ODD_FLOATS)
    numbers = found.floats + [float(i) for i in found.ints]
    return "other", rng.choice(numbers)


def _number(rng: random.Random, root: dict[str, Any], found: Sites) -> tuple[Edit, dict[str, Any]]:
    path = rng.choice(found.numbers)
    old = get(root, path)
    if isinstance(old, float):
        kind, new = _new_float(rng, old, found)
    else:
        kind, new_int = _new_int(rng, old, found)
        new = new_int
    if rng.random() < 0.05:  # the other type: 64 -> 64.0, 0.5 -> 0
        new = float(new) if isinstance(new, int) else int(new) if math.isfinite(new) else 0
        kind += " retyped"
    return Edit(show(path), kind, old, new), edited(root, path, _set(new))


def _string(rng: random.Random, root: dict[str, Any], found: Sites) -> tuple[Edit, dict[str, Any]]:
    path = rng.choice(found.strings)
    old = get(root, path)
    field = next((key for key in reversed(path) if isinstance(key, str)), "")
    choices = LITERALS.get(field)
    roll = rng.random()
    if choices is not None and roll < 0.6:
        kind, new = "literal", rng.choice(choices)
    elif roll < 0.85:
        kind, new = "other name", rng.choice(found.texts)
    elif roll < 0.95:
        kind, new = "renamed", old + "_x"
    else:
        kind, new = "empty", ""
    return Edit(show(path), kind, old, new), edited(root, path, _set(new))


def _flag(rng: random.Random, root: dict[str, Any], found: Sites) -> tuple[Edit, dict[str, Any]]:
    path = rng.choice(found.flags)
    old = get(root, path)
    new: Any
    if isinstance(old, bool):
        kind, new = "flip", not old
    else:
        kind, new = "set", rng.choice([0, 1, 2, 64, 0.5, 1.0, "x", True, [], {}])
    return Edit(show(path), kind, old, new), edited(root, path, _set(new))


def _list(rng: random.Random, root: dict[str, Any], found: Sites) -> tuple[Edit, dict[str, Any]]:
    path = rng.choice(found.lists)
    old = get(root, path)
    index = rng.randrange(len(old))
    other = rng.randrange(len(old))
    roll = rng.randrange(4)
    if roll == 0:
        new = old[:index] + old[index + 1:]
        kind = f"drop [{index}]"
    elif roll == 1:
        new = [*old[:index + 1], old[index], *old[index + 1:]]
        kind = f"duplicate [{index}]"
    elif roll == 2:
        new = list(old)
        new[index], new[other] = new[other], new[index]
        kind = f"swap [{index}] [{other}]"
    else:
        new = [*old[:index], *old[index + 1:], old[index]]
        kind = f"move [{index}] last"
    return Edit(show(path), kind, _brief(old), _brief(new)), edited(root, path, _set(new))


def _brief(items: list[Any]) -> object:
    return [item.get("name", item.get("layers", "{..}")) if isinstance(item, dict) else item
            for item in items]


def _drop_key(rng: random.Random, root: dict[str, Any], found: Sites
              ) -> tuple[Edit, dict[str, Any]]:
    path = rng.choice(found.keys)

    def change(container: Any, key: Key) -> None:
        del container[key]

    old = get(root, path)
    return Edit(show(path), "drop key", _short(old), "(absent)"), edited(root, path, change)


def _renamed(node: Any, old: str, new: str) -> Any:
    if isinstance(node, dict):
        return {(new if key == old else key): _renamed(value, old, new)
                for key, value in node.items()}
    if isinstance(node, list):
        return [_renamed(value, old, new) for value in node]
    return new if node == old else node


def _rename_everywhere(rng: random.Random, root: dict[str, Any], found: Sites
                       ) -> tuple[Edit, dict[str, Any]]:
    """A name (a pool's, a layer's, a view's) replaced wherever it occurs, keys included: the
    plan stays consistent with itself, only the name changes."""
    old = rng.choice(found.pools if rng.random() < 0.5 else found.texts)
    new = rng.choice([*found.pools, *found.texts, old + "_x", "kv", "swa", "index", "host",
                      "device", "device.1", "mamba_conv7"])
    top: dict[str, Any] = _renamed(root, old, new)
    return Edit("(everywhere)", "rename everywhere", old, new), top


def _move_pool(rng: random.Random, root: dict[str, Any], found: Sites
               ) -> tuple[Edit, dict[str, Any]]:
    """A pool moved to the other memory, its tensors' host_resident flags with it."""
    pool = rng.choice(root["pools"])
    location = "device" if pool["location"] == "host" else "host"
    top = dict(root)
    top["pools"] = [dict(p, location=location) if p is pool else p for p in root["pools"]]
    top["tensors"] = [dict(t, host_resident=location == "host") if t["pool"] == pool["name"]
                      else t for t in root["tensors"]]
    return Edit(f"pools[{pool['name']}].location", "move pool with its tensors",
                pool["location"], location), top


def _request_table(rng: random.Random, root: dict[str, Any], found: Sites
                   ) -> tuple[Edit, dict[str, Any]]:
    """SGLang: max_running_requests and the request table's rows, or the table's width and
    row stride, changed together (vLLM plans: a number edit)."""
    table = root.get("req_to_token")
    if table is None:
        return _number(rng, root, found)
    value = rng.choice([1, 2, 3, 1000, 2**31, 2**40, 2**61, 2**62, *found.ints])
    top = dict(root)
    if rng.random() < 0.5:
        top["max_running_requests"] = value
        top["req_to_token"] = dict(table, shape=[value + 1, table["shape"][1]])
        return Edit("max_running_requests", "with the table's rows",
                    root["max_running_requests"], value), top
    top["req_to_token"] = dict(table, shape=[table["shape"][0], value], strides=[value, 1])
    return Edit("req_to_token.shape[1]", "with its row stride", table["shape"][1], value), top


FIGURE_PARTS = ("tensors", "pools", "req_to_token", "groups", "device_pools")
"""Where a plan's layout lives; its figures are the numbers elsewhere."""


def _two_figures(rng: random.Random, root: dict[str, Any], found: Sites
                 ) -> tuple[Edit, dict[str, Any]]:
    """SGLang: two figures (numbers outside the pools, tensors and request table) moved by the
    same step, so that one derived from the other may still agree with it (vLLM plans: a
    number edit)."""
    figures = [path for path in found.numbers if path[0] not in FIGURE_PARTS]
    if "req_to_token" not in root or len(figures) < 2:
        return _number(rng, root, found)
    first, second = rng.sample(figures, 2)
    page = root.get("page_size", 1)
    step = rng.choice([1, -1, page, -page, 2, rng.choice(found.ints)])
    scale = rng.random() < 0.3
    top = root
    for path in (first, second):
        old = get(root, path)
        new = old * 2 if scale else old + step
        top = edited(top, path, _set(type(old)(new)))
    return Edit(f"{show(first)} & {show(second)}", "x2" if scale else f"both {step:+}",
                get(root, first), get(root, second)), top


SPECULATIVE_COUNTS = ("num_steps", "eagle_topk", "num_draft_tokens")


def _speculative_counts(rng: random.Random, root: dict[str, Any], found: Sites
                        ) -> tuple[Edit, dict[str, Any]]:
    """SGLang with speculative decoding: a step, top-k or draft-token count changed and the
    request table widened or narrowed by the extra columns it moves, so that the context (and
    the capacity) stays (other plans: a number edit)."""
    spec = root.get("speculative")
    if not spec:
        return _number(rng, root, found)
    key = rng.choice(SPECULATIVE_COUNTS)
    changed = dict(spec, **{key: rng.choice([1, 2, 3, 4, 8, spec[key] + 1])})
    page = root["page_size"] * root["budget"].get("dcp_size", 1)
    extra = [extra_columns(page, *(counts[k] for k in SPECULATIVE_COUNTS))
             for counts in (spec, changed)]
    table = root["req_to_token"]
    width = table["shape"][1] + extra[1] - extra[0]
    top = dict(root, speculative=changed,
               req_to_token=dict(table, shape=[table["shape"][0], width], strides=[width, 1]))
    return Edit(f"speculative.{key}", "with the table's extra columns", spec[key],
                changed[key]), top


EDITORS = [(_number, 55), (_string, 10), (_flag, 5), (_list, 17), (_drop_key, 5),
           (_rename_everywhere, 4), (_move_pool, 2), (_request_table, 2), (_two_figures, 6),
           (_speculative_counts, 2)]


def random_edit(rng: random.Random, root: dict[str, Any], found: Sites
                ) -> tuple[Edit, dict[str, Any]]:
    editor = rng.choices([e for e, _ in EDITORS], weights=[w for _, w in EDITORS])[0]
    return editor(rng, root, found)
