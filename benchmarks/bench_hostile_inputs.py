"""Every hostile input on every command that reads a file, and on every public loader: the
outcome, peak memory and time of each, one process each (issue 36).

    .venv/bin/python benchmarks/bench_hostile_inputs.py [--keys 2000000] [--layers 1000000]

The inputs are tests/support/hostile_inputs.py's (a FIFO, /dev/zero, a 1 GB file, 100,000 levels of
nesting, NaN, 2^70, non-UTF-8 bytes, a byte order mark, `--keys` unknown keys, and an SGLang
plan of `--layers` layers, in one tensor or ten, for the commands that read plans). A command
must exit 2 with one `error:` line; a loader must raise PlanError or ValidationError. Peak
memory is the process's maximum resident set (interpreter and imports included); the table
marks any above 300 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.hostile_inputs import BUILDERS, SPECIAL, commands, loaders  # noqa: E402

LIMIT_MIB = 300
TIMEOUT_S = 120

CHILD = """
import sys, json
sys.path.insert(0, {tests!r})
kind, name, path = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "command":
    from hisparse_plan.cli.main import main
    import io, contextlib
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(json.loads(path))
    lines = err.getvalue().splitlines()
    ok = (code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
          and "internal error" not in lines[0] and out.getvalue() == "")
    print(json.dumps({{"ok": ok, "what": lines[0][:160] if lines else f"exit {{code}}"}}))
else:
    from pydantic import ValidationError
    from hisparse_plan.errors import PlanError
    from support.hostile_inputs import loaders
    from hisparse_plan.checking import check_plan
    call = loaders()[name][1]
    try:
        result = call(path)
        if name == "load_plan":
            check_plan(result)
        print(json.dumps({{"ok": False, "what": "accepted"}}))
    except (PlanError, ValidationError) as error:
        print(json.dumps({{"ok": True, "what": type(error).__name__ + ": "
                          + str(error).splitlines()[0][:140]}}))
"""


WRITER = f"""
import json, sys
from pathlib import Path
sys.path.insert(0, {str(REPO / "tests")!r})
from support.hostile_inputs import good_plan, write_inputs
folder = Path(sys.argv[1])
paths = write_inputs(folder, int(sys.argv[2]), int(sys.argv[3]))
(folder / "good.plan.json").write_text(json.dumps(good_plan()))
print(json.dumps([[name, kind, path] for (name, kind), path in paths.items()]))
"""


def _run_measured(kind: str, name: str, arg: str) -> tuple[bool, str, float, float]:
    """run_child with the child's own peak resident set (os.wait4's rusage)."""
    code = CHILD.format(tests=str(REPO / "tests"))
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen([sys.executable, "-c", code, kind, name, arg],
                                 stdout=out, stderr=subprocess.STDOUT)
        deadline = started + TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                child.kill()
                _, status, usage = os.wait4(child.pid, 0)
                return False, f"still running after {TIMEOUT_S} s", usage.ru_maxrss / 1024, \
                    TIMEOUT_S
            time.sleep(0.02)
        child.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        out.seek(0)
        text = out.read().decode(errors="replace")
    peak = usage.ru_maxrss / 1024
    try:
        result = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False, f"crashed: {text[-160:]!r}", peak, elapsed
    return bool(result["ok"]), str(result["what"]), peak, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--layers", type=int, default=1_000_000)
    parser.add_argument("--only", help="run the rows whose command or loader contains this")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hostile-"))
    # Written by a child: a forked process's peak counts its parent's pages at the fork, so
    # this process stays as small as the interpreter.
    written = subprocess.run(
        [sys.executable, "-c", WRITER, str(folder), str(args.keys), str(args.layers)],
        check=True, capture_output=True, text=True).stdout
    paths = {(name, kind): path for name, kind, path in json.loads(written)}
    good = folder / "good.plan.json"
    inputs = [*BUILDERS, *SPECIAL, "10^6-layer plan", "10^6 layers, 10 tensors"]
    rows: list[tuple[str, str, bool, str, float, float]] = []
    for command, (kind, argv) in commands({"plan": str(good)}).items():
        if args.only and args.only not in command:
            continue
        for name in inputs:
            if (name, kind) in paths:
                ok, what, peak, seconds = _run_measured(
                    "command", command, json.dumps(argv(paths[name, kind])))
                rows.append((name, command, ok, what, peak, seconds))
    for loader, (kind, _) in loaders().items():
        if args.only and args.only not in loader:
            continue
        for name in inputs:
            if (name, kind) not in paths or (name == "FIFO" and loader != "load_config_file"):
                continue  # the text loaders take bytes; nothing reads a FIFO for them
            ok, what, peak, seconds = _run_measured("loader", loader, paths[name, kind])
            rows.append((name, loader, ok, what, peak, seconds))
    print(f"{'input':<24} {'command / loader':<36} {'outcome':<8} {'peak MiB':>8} "
          f"{'time s':>7}  first line")
    failed = 0
    for name, where, ok, what, peak, seconds in rows:
        over = peak > LIMIT_MIB
        failed += (not ok) or over
        outcome = ("refused" if ok else "NOT REFUSED") + (" >300" if over else "")
        print(f"{name:<24} {where:<36} {outcome:<8} {peak:>8.0f} {seconds:>7.2f}  {what[:90]}")
    worst = max((row[4] for row in rows), default=0.0)
    print(f"\n{len(rows)} runs, {failed} not refused or above {LIMIT_MIB} MiB; "
          f"highest peak {worst:.0f} MiB; {args.keys} unknown keys, {args.layers}-layer plan")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
