"""SGLang's part of `hisparse-plan plan` and `explain` (`--engine sglang`)."""

from __future__ import annotations

import argparse

from hisparse_plan.cli.render import Renderer
from hisparse_plan.cli.serving import show_serving
from hisparse_plan.cli.sglang.render import render_sglang_plan
from hisparse_plan.cli.sglang.source import resolve_sglang_source
from hisparse_plan.operator import Explanation, explain
from hisparse_plan.targets.sglang import plan_sglang


def run_plan(args: argparse.Namespace) -> int:
    """`plan --engine sglang`: the pools SGLang 0.5.23 would allocate on one rank."""
    source = resolve_sglang_source(args)
    result = plan_sglang(source.request)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    out = Renderer(plain=args.plain)
    render_sglang_plan(out, source.title, result)
    show_serving(out, args, result.capacity.max_concurrency)
    return 0


def explain_plan(args: argparse.Namespace) -> tuple[str, Explanation]:
    """`explain --engine sglang`: the request's title and every number of its plan."""
    source = resolve_sglang_source(args)
    return source.title, explain(source.request)
