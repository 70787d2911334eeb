"""`hisparse-plan tune`: the least host pool for a target, or the best a GPU and DRAM can do."""

from __future__ import annotations

import argparse
import math

from hisparse_plan.cli.arg_types import positive_size
from hisparse_plan.cli.command import Command
from hisparse_plan.cli.engines import add_settings_arguments, add_source_arguments, resolve_source
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.render import Renderer, add_output_arguments, concurrency
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.models import INT64_MAX
from hisparse_plan.operator import BestTune, HostPoolTune, best_concurrency, smallest_host_pool

BINDS = {"host": "the host pool", "device": "the GPU", "both": "both pools"}


def _target(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid target {text!r}: expected a number of concurrent requests"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a target above 0, got {text!r}")
    if value > INT64_MAX:
        # Every request holds at least one block of a pool that int64 offsets address.
        raise argparse.ArgumentTypeError(
            f"expected a target of at most {INT64_MAX} (no pool an int64 offset addresses "
            f"holds more requests), got {text!r}"
        )
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    goal = parser.add_argument_group("goal (exactly one)").add_mutually_exclusive_group(
        required=True
    )
    goal.add_argument("--target", type=_target, metavar="N",
                      help="concurrent max_model_len requests to reach: prints the smallest "
                           "host pool that does")
    goal.add_argument("--dram", type=positive_size, metavar="SIZE",
                      help="host memory the pool may take: prints the best concurrency and the "
                           "least host pool that gets it")
    parser.add_argument("--metric", choices=("max", "steady"), default="max",
                        help="max_concurrency (default) or steady_state_concurrency")
    add_settings_arguments(parser, host_pool=False)
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    source = resolve_source(args)
    answer: HostPoolTune | BestTune
    if args.target is not None:
        answer = smallest_host_pool(source.request, args.target, args.metric)
    elif args.dram is not None:
        answer = best_concurrency(source.request, args.dram, args.metric)
    else:  # argparse requires one of the two
        raise CommandError("expected --target N or --dram SIZE")
    out = Renderer(plain=args.plain)
    if args.json:
        print(answer.model_dump_json(indent=2))
    elif isinstance(answer, HostPoolTune):
        render_host_pool(out, source.title, answer)
    else:
        render_best(out, source.title, answer)
    return 0


def _pool(nbytes: int, blocks: int, step: int) -> str:
    return f"{format_size(nbytes)} = {nbytes} bytes ({blocks} blocks of {step} bytes)"


def render_host_pool(out: Renderer, title: str, answer: HostPoolTune) -> None:
    capacity = answer.capacity
    out.heading(
        f"{title}: smallest host pool for {answer.target:g} concurrent "
        f"{answer.max_model_len}-token requests ({answer.metric})"
    )
    below = (
        "refused by the planner (too small for one request)"
        if answer.below is None
        else f"{answer.below:.4f}, short of {answer.target:g}"
    )
    out.pairs([
        ("host pool", _pool(answer.host_pool_bytes, answer.host_blocks, answer.step_bytes)),
        ("host_pool_gib", f"{answer.host_pool_gib!r} (exact)"),
        ("concurrency", f"{concurrency(capacity.max_concurrency)} max, "
                        f"{concurrency(capacity.steady_state_concurrency)} steady state"),
        ("binds on", BINDS[answer.binding]),
        ("one block less", below),
    ])


def render_best(out: Renderer, title: str, best: BestTune) -> None:
    capacity = best.capacity
    out.heading(
        f"{title}: best concurrency with {format_size(best.dram_bytes)} of DRAM for the host "
        f"pool, {best.max_model_len}-token requests ({best.metric})"
    )
    out.pairs([
        ("concurrency", f"{concurrency(capacity.max_concurrency)} max, "
                        f"{concurrency(capacity.steady_state_concurrency)} steady state"),
        ("binds on", BINDS[best.binding]),
        ("host pool needed", _pool(best.host_pool_bytes, best.host_blocks, best.step_bytes)),
        ("host_pool_gib", f"{best.host_pool_gib!r} (exact)"),
        ("DRAM to spare", f"{format_size(best.spare_dram_bytes)} (buys no more concurrency)"),
    ])


COMMAND = Command(
    name="tune",
    help="the smallest host pool for a target concurrency, or the best for given GPU and DRAM",
    description="Search the host pool in whole host blocks, planning at every step. --target "
    "finds the least host pool reaching N concurrent requests (one block less, so one byte "
    "less, misses); --dram finds the best concurrency with that much DRAM and the least host "
    "pool that gets it. Both say which pool binds.",
    configure=configure,
    run=run,
)
