"""`hisparse-plan verify`: allocate a plan's pools with torch and check every layer's pages.

The torch backend (`hisparse_plan.torch`, behind the `torch` extra) is imported only here, so
every other subcommand works without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from collections.abc import Callable
from importlib import import_module
from types import ModuleType
from typing import Any

from hisparse_plan.cli.arg_types import non_negative_int, positive_int
from hisparse_plan.cli.command import Command
from hisparse_plan.cli.engines import (
    add_settings_arguments,
    add_source_arguments,
    make_plan,
    resolve_source,
)
from hisparse_plan.cli.errors import CheckFailed, CommandError
from hisparse_plan.cli.progress import Progress, accepts_progress, progress_reporter
from hisparse_plan.cli.render import Renderer, add_output_arguments
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.models import KVCachePlan

BACKEND = "hisparse_plan.torch"


def _device(text: str) -> str:
    if re.fullmatch(r"cpu|meta|cuda(:\d+)?", text) is None:
        raise argparse.ArgumentTypeError(
            f"invalid device {text!r}: expected cpu, cuda, cuda:N or meta"
        )
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    add_settings_arguments(parser)
    group = parser.add_argument_group("backend")
    group.add_argument("--device", type=_device,
                       help="where the device pool lives: cuda, cuda:N or cpu (default: cuda "
                            "when torch sees a GPU, else cpu); meta allocates nothing and "
                            "checks every full-size view against the plan instead")
    group.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                       help="pin the host pool (default: pinned with a CUDA device, not on cpu); "
                            "--pin not with --device meta")
    group.add_argument("--blocks", type=positive_int, metavar="N",
                       help="check a sample of about N block ids per pool, always the first and "
                            "last two (default: every block); not with --device meta")
    group.add_argument("--stage", type=non_negative_int, metavar="K",
                       help="for a plan with pipeline stages: allocate and verify stage K's "
                            "device pool and layers (required there, one stage per run); "
                            "with --device meta, check only stage K (default: every stage)")
    group.add_argument("--quiet", action="store_true",
                       help="no progress bar (by default, a step that runs over a second shows "
                            "one when stderr is a terminal)")
    add_output_arguments(parser)


def _backend() -> ModuleType:
    try:
        return import_module(BACKEND)
    except ImportError as error:
        missing = _missing_module(error)
        if missing == "torch" or missing.startswith("torch."):
            raise CommandError(
                "verify needs torch: pip install 'hisparse-plan[torch]'"
            ) from None
        if missing == BACKEND:
            raise CommandError(
                f"verify needs the torch backend ({BACKEND}), which this installation lacks"
            ) from None
        raise CommandError(f"the torch backend ({BACKEND}) failed to import: {error}") from None


def _missing_module(error: BaseException | None) -> str:
    """The module whose absence caused `error`, following `raise ... from` causes."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name:
            return error.name
        error = error.__cause__
    return ""


def _refuse_conflicts(args: argparse.Namespace) -> None:
    """Flags that cannot combine: the meta device holds no bytes to pin or to sample."""
    if args.device != "meta":
        return
    if args.pin:
        raise CommandError("--pin cannot combine with --device meta: the meta device "
                           "allocates nothing, so there is no host pool to pin")
    if args.blocks is not None:
        raise CommandError("--blocks cannot combine with --device meta: the meta check binds "
                           "every view at full size and writes no blocks to sample")


def _with_progress(function: Callable[..., Any], progress: Progress | None) -> dict[str, Any]:
    """The progress keyword for a backend function that takes one (backends before and
    after step progress both work)."""
    return {"progress": progress} if progress is not None and accepts_progress(function) else {}


def _stage_option(plan: KVCachePlan, stage: int | None) -> dict[str, int]:
    """The backend's stage keyword: omitted for a one-stage plan without --stage (backends
    before pipeline stages work), required for a plan with stages."""
    count = len(plan.device_pools)
    if stage is None and count > 1:
        raise CommandError(
            f"the plan has {count} pipeline stages, each with its own device pool; pass "
            f"--stage K (0 to {count - 1}) to verify one stage's pool"
        )
    if stage is not None and stage >= count:
        expected = "0" if count == 1 else f"0 to {count - 1}"
        raise CommandError(
            f"--stage {stage}: the plan has {count} pipeline stage{'s' if count > 1 else ''}; "
            f"expected {expected}"
        )
    return {} if stage is None else {"stage": stage}


def run(args: argparse.Namespace) -> int:
    _refuse_conflicts(args)
    source = resolve_source(args)  # a bad input is refused before torch is loaded
    backend = _backend()
    plan = make_plan(source.request)
    device = args.device or backend.default_device()
    if device == "meta":
        return _meta_check(backend, plan, source.title, args)
    stage = _stage_option(plan, args.stage)
    pin = args.pin if args.pin is not None else device.startswith("cuda")
    # Nothing is printed before the pools exist: a refusal stays the one line on stderr.
    refused = getattr(backend, "BackendError", ())
    try:
        with (
            progress_reporter(quiet=args.quiet) as progress,
            backend.allocate(
                plan, device=device, pin=pin, **stage,
                **_with_progress(backend.allocate, progress),
            ) as pools,
        ):
            report = backend.verify(
                plan, pools, blocks=args.blocks, **_with_progress(backend.verify, progress)
            )
    except backend.VerifyError as error:
        raise CheckFailed(f"verify failed: {error}") from error
    except refused as error:  # a sibling of PlanError in later backends: still a refusal
        raise CommandError(str(error)) from error
    device_pool = plan.device_pools[args.stage or 0].size
    pools_text = {
        "host pool": "none" if plan.host_pool is None else
        f"{format_size(plan.host_pool.size)}, {'pinned' if pin else 'pageable'}",
        "device pool": f"{format_size(device_pool)} on {device}"
        + ("" if len(plan.device_pools) == 1 else f" (pipeline stage {args.stage})"),
    }
    fields = {**dataclasses.asdict(report), "gb_per_s": report.gb_per_s}
    _show(fields, f"{source.title}: verified on {device}", args, pools_text)
    return 0


def _meta_check(backend: ModuleType, plan: KVCachePlan, title: str,
                args: argparse.Namespace) -> int:
    """On the meta device nothing is allocated: every view is bound at full size and checked
    against the plan's numbers instead (no bytes to write)."""
    if args.stage is not None:
        _stage_option(plan, args.stage)
    try:
        report = (backend.meta_check(plan) if args.stage is None
                  else backend.meta_check(plan, stage=args.stage))
    except backend.BackendError as error:
        raise CommandError(str(error)) from error
    fields: dict[str, Any] = {"layers": report.layers, "host_bytes": report.host_bytes,
                              "device_bytes": report.device_bytes}
    if len(plan.device_pools) > 1:
        fields["stage_bytes"] = list(report.stage_bytes)
    _show(fields, f"{title}: every view bound on the meta device", args)
    return 0


def _show(fields: dict[str, Any], heading: str, args: argparse.Namespace,
          context: dict[str, str] | None = None) -> None:
    """The report: `fields` as JSON, or as labelled lines after `context` (human only)."""
    # Non-finite floats (a rate over zero seconds) become null so that the JSON stays JSON.
    shown = {name: None if isinstance(value, float) and not math.isfinite(value) else value
             for name, value in fields.items()}
    if args.json:
        print(json.dumps(shown, indent=2))
        return
    out = Renderer(plain=args.plain)
    out.heading(heading)
    out.pairs([*(context or {}).items(), *((key, _text(value)) for key, value in shown.items())])


def _text(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


COMMAND = Command(
    name="verify",
    help="allocate the plan's pools with torch and verify every page",
    description="Allocate the host and device pools the plan describes (torch backend, the "
    "torch extra), write and read back every layer's pages, and report what was checked. "
    "Mind the sizes: the pools are allocated for real (use --gpu-mem/--host-pool to shrink "
    "them, --device cpu --no-pin without a GPU). Exit 1 when verification finds a fault.",
    configure=configure,
    run=run,
)
