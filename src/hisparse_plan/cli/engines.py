"""The engines a plan is for: vLLM (the default) and SGLang, the one module of cli/ outside
`vllm/` and `sglang/` that names them. Each is a target with its own flags, its own view of
`plan` and `explain`, and its own figures; `--engine` picks one (`plan`, `explain`) or several
side by side (`capacity`). A flag that only one engine reads, given without that engine, is
refused by name.

The commands that plan for the default engine alone (`tune`, `verify`, `manifest`, `capacity`
without --engine) take its request, its flags and its planner from here too."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.figures import Figures
from hisparse_plan.cli.sglang import plan_command as sglang_command
from hisparse_plan.cli.sglang.figures import sglang_figures
from hisparse_plan.cli.sglang.source import SGLANG_ONLY, add_sglang_arguments
from hisparse_plan.cli.vllm import plan_command as vllm_command
from hisparse_plan.cli.vllm.capacity import add_capacity_arguments, gpu_sizing, run_capacity
from hisparse_plan.cli.vllm.figures import vllm_figures
from hisparse_plan.cli.vllm.source import (
    Source,
    add_plan_arguments,
    add_settings_arguments,
    add_source_arguments,
    resolve_source,
)
from hisparse_plan.models.engines import DEFAULT_ENGINE
from hisparse_plan.operator import Explanation
from hisparse_plan.targets.vllm import plan as make_plan

__all__ = [
    "ENGINES", "SGLANG", "VLLM", "Engine", "Figures", "Source", "add_capacity_arguments",
    "add_engine_choice",
    "add_engines_arguments", "add_plan_arguments", "add_settings_arguments",
    "add_source_arguments", "chosen_engines", "engine_list", "make_plan", "resolve_source",
    "run_capacity",
]
"""The engine table, and the default engine's request (`Source`, `resolve_source` and its
flags), planner (`make_plan`) and capacity comparison (`run_capacity`)."""

VLLM_ONLY: Final[tuple[tuple[str, str], ...]] = (
    ("request", "--request"),
    ("specs_from_vllm", "--specs-from-vllm"),
    ("host_pool", "--host-pool"),
    ("spec_tokens", "--spec-tokens"),
    ("device_buffer", "--device-buffer"),
    ("layout", "--layout"),
    ("block_size", "--block-size"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("max_concurrent_batches", "--max-concurrent-batches"),
    ("num_gpu_blocks_override", "--num-gpu-blocks-override"),
    ("no_hisparse", "--no-hisparse"),
    ("pp", "--pipeline-parallel-size"),
    ("enable_expert_parallel", "--enable-expert-parallel"),
    ("stage_gpu_mem", "--stage-gpu-mem"),
    ("auto_fit", "--auto-fit"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("activation_reserve", "--activation-reserve"),
    ("extensible_kv_cache", "--enable-extensible-kv-cache"),
    ("speculative", "--speculative"),
    ("vllm_version", "--vllm"),
    ("prefix_caching", "--enable-prefix-caching"),
    ("hybrid_manager", "--enable-hybrid-kv-cache-manager"),
    ("dcp", "--decode-context-parallel-size"),
    ("sweep", "--sweep"),
    ("points", "--points"),
    ("plot", "--plot"),
    ("compare", "--compare"),
    ("node_gpus", "--node-gpus"),
    ("plot_memory", "--plot-memory"),
)
"""(dest, flag) of every flag only the vLLM target reads."""


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    title: str
    column: str
    """Its column's heading in `capacity --engine` figures."""
    only: tuple[tuple[str, str], ...]
    own_arguments: Callable[[argparse.ArgumentParser], None]
    """Adds the flags only it reads, after --engine (the default engine's are the hardware
    and serving flags themselves)."""
    plan: Callable[[argparse.Namespace], int]
    """Runs `plan` for it."""
    explain: Callable[[argparse.Namespace], tuple[str, Explanation]]
    """The title and every number of its plan, for `explain`."""
    figures: Callable[[argparse.Namespace], Figures]
    gpu_note: Callable[[argparse.Namespace], str | None]
    """With --gpu, what its KV memory on that GPU assumed (None: nothing to say)."""


def _given(value: object) -> bool:
    return value is not None and value is not False


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """The default engine's flags are the hardware and serving ones, added before --engine."""


def _nothing_to_note(args: argparse.Namespace) -> None:
    return None


VLLM: Final = Engine("vllm", "vLLM", "vLLM", VLLM_ONLY, _no_arguments, vllm_command.run_plan,
                     vllm_command.explain_plan, vllm_figures, gpu_sizing)
SGLANG: Final = Engine("sglang", "SGLang 0.5.23", "SGLang", SGLANG_ONLY, add_sglang_arguments,
                       sglang_command.run_plan, sglang_command.explain_plan, sglang_figures,
                       _nothing_to_note)
ENGINES: Final[dict[str, Engine]] = {engine.name: engine for engine in (VLLM, SGLANG)}


def add_engines_arguments(
    parser: argparse.ArgumentParser, *, several: bool,
    between: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """What to plan and the hardware and serving flags (the default engine's, which the others
    read too), the command's own (`between`), --engine, and each engine's own flags."""
    add_source_arguments(parser)
    add_settings_arguments(parser)
    if between is not None:
        between(parser)
    add_engine_choice(parser, several=several)
    for engine in ENGINES.values():
        engine.own_arguments(parser)


def engine_list(text: str) -> tuple[str, ...]:
    """`vllm`, `sglang` or `vllm,sglang`: each once."""
    names = tuple(part.strip().lower() for part in text.split(","))
    unknown = [name for name in names if name not in ENGINES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected engines from {', '.join(ENGINES)} separated by commas, got {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected each engine once, got {text!r}")
    return names


def add_engine_choice(parser: argparse.ArgumentParser, *, several: bool) -> None:
    help_text = ("the engines to plan for, side by side: vllm, sglang or vllm,sglang "
                 "(default vllm)" if several else
                 "the engine to plan for: vllm (default) or sglang")
    parser.add_argument("--engine", type=engine_list, metavar="NAME" + (",..." if several
                                                                         else ""),
                        help=help_text)


def chosen_engines(args: argparse.Namespace, *, several: bool) -> list[Engine]:
    """The engines `--engine` names (vLLM without it); a flag another engine only reads is
    refused, naming it and its engine."""
    names: Sequence[str] = args.engine or (DEFAULT_ENGINE,)
    if not several and len(names) > 1:
        raise CommandError(f"--engine: plan prints one engine's plan; expected vllm or sglang, "
                           f"got {','.join(names)} (compare engines with `capacity`)")
    engines = [ENGINES[name] for name in names]
    for other in ENGINES.values():
        if other in engines:
            continue
        for dest, flag in other.only:
            if _given(getattr(args, dest, None)):
                raise CommandError(
                    f"{flag} applies to {other.title} only; expected --engine {other.name} "
                    f"with it, got --engine {','.join(names)}")
    return engines
