"""What a deployment serves beyond one engine's plan: data-parallel ranks and vLLM's
`--max-num-seqs` cap. One plan is one rank's (every TP rank of a DP rank holds the same
requests); with DP attention each DP rank holds its own requests in its own cache, so a node
serves `dp x` one rank's concurrency."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hisparse_plan.cli.render import Renderer, concurrency
from hisparse_plan.operator.node import served_node, served_per_rank


@dataclass(frozen=True, slots=True)
class Serving:
    dp: int = 1
    """Data-parallel ranks, each with its own requests and KV cache."""
    max_num_seqs: int | None = None
    """The most requests one engine (one DP rank) runs at once; None: not capped."""

    def per_rank(self, pools_hold: float) -> float:
        """Concurrent requests one DP rank serves: what its pools hold, capped."""
        return served_per_rank(pools_hold, self.max_num_seqs)

    def node(self, pools_hold: float) -> float:
        """Concurrent requests all DP ranks serve together."""
        return served_node(pools_hold, self.dp, self.max_num_seqs)

    @property
    def shown(self) -> bool:
        return self.dp > 1 or self.max_num_seqs is not None


def serving_from(args: argparse.Namespace) -> Serving:
    return Serving(dp=args.dp or 1, max_num_seqs=args.max_num_seqs)


def render_serving(out: Renderer, serving: Serving, pools_hold: float) -> None:
    """The served concurrency, when DP ranks or a --max-num-seqs cap change it."""
    if not serving.shown:
        return
    pairs = []
    if serving.max_num_seqs is not None:
        pairs.append(("per DP rank",
                      f"{concurrency(serving.per_rank(pools_hold))} = min(pools "
                      f"{concurrency(pools_hold)}, --max-num-seqs {serving.max_num_seqs})"))
    if serving.dp > 1:
        pairs.append(("node", f"{concurrency(serving.node(pools_hold))} = {serving.dp} DP ranks "
                              f"x {concurrency(serving.per_rank(pools_hold))}"))
    out.pairs(pairs, title="served (concurrent max_model_len requests)")


def show_serving(out: Renderer, args: argparse.Namespace, pools_hold: float) -> None:
    """Below a summary, after a blank line: what the flags' DP ranks and --max-num-seqs cap
    serve of `pools_hold`; nothing when they change nothing."""
    serving = serving_from(args)
    if serving.shown:
        out.line()
        render_serving(out, serving, pools_hold)
