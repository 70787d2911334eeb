"""Every field of SGLang 0.5.23's `ServerArgs`, read from its own record: the table
src/hisparse_plan/adapters/sglang/server_args_0_5_23.json holds.

    PYTHONPATH=references/sglang_stubs /work/sglang/bin/python \\
        references/sglang_server_args_table.py [--write | --check]

Without a flag it prints the table (JSON); `--write` writes it over the package's copy;
`--check` exits 1 naming the fields that differ (tests/adapters/test_sglang_server_args_table.py
runs
it). ServerArgs is a msgspec Struct assembled from the namespaces of
sglang/srt/arg_groups/fields/ (`ServerArgs._NS_BY_FIELD`); each field is listed with its
namespace and its declared default (JSON, or absent when it has none or a factory)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

TABLE = (Path(__file__).resolve().parent.parent / "src" / "hisparse_plan" / "adapters"
         / "sglang" / "server_args_0_5_23.json")


def _default(field: Any) -> tuple[bool, Any]:  # noqa: ANN401 (a msgspec FieldInfo)
    msgspec = importlib.import_module("msgspec")
    if field.default is msgspec.NODEFAULT:
        return False, None
    try:
        json.dumps(field.default)
    except TypeError:
        return False, None
    return True, field.default


def server_args_table() -> dict[str, Any]:
    """{"sglang": version, "fields": {name: {"namespace": ..., "default": ...}}}, by name."""
    msgspec = importlib.import_module("msgspec")
    version = importlib.import_module("sglang").__version__
    ServerArgs = importlib.import_module("sglang.srt.server_args").ServerArgs

    namespaces: dict[str, str] = ServerArgs._NS_BY_FIELD
    fields: dict[str, Any] = {}
    for field in sorted(msgspec.structs.fields(ServerArgs), key=lambda f: f.name):
        entry: dict[str, Any] = {"namespace": namespaces.get(field.name, "")}
        has, value = _default(field)
        if has:
            entry["default"] = value
        fields[field.name] = entry
    return {"sglang": version, "fields": fields}


def table_text(table: dict[str, Any]) -> str:
    """The table as JSON, one field a line (sorted), for diffs that read."""
    lines = [f"  {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}"
             for name, entry in table["fields"].items()]
    return (f'{{"sglang": {json.dumps(table["sglang"])}, "fields": {{\n'
            + ",\n".join(lines) + "\n}}\n")


def main(argv: list[str]) -> int:
    table = server_args_table()
    text = table_text(table)
    if "--write" in argv:
        TABLE.write_text(text, encoding="utf-8")
        print(f"{len(table['fields'])} fields written to {TABLE}")
        return 0
    if "--check" in argv:
        pinned = json.loads(TABLE.read_text(encoding="utf-8"))
        theirs, ours = set(table["fields"]), set(pinned["fields"])
        if table != pinned:
            print(json.dumps({"version": [table["sglang"], pinned["sglang"]],
                              "only_in_sglang": sorted(theirs - ours),
                              "only_in_table": sorted(ours - theirs),
                              "other_entry": sorted(name for name in theirs & ours
                                                    if table["fields"][name]
                                                    != pinned["fields"][name])}))
            return 1
        print(f"{len(theirs)} fields: the table equals SGLang {table['sglang']}'s ServerArgs")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
