"""Direct or staged: the choice per pair of instances, from a cost model (see
docs/transfer.md#staged-transfers). A copy a transfer engine posts costs a fixed time plus
its bytes at the link's speed; a staged transfer moves whole slabs (one copy per run of
blocks where a slab is its whole block), then copies the request's bytes once more locally.
The estimates are per source block of a request whose blocks come in runs of `run_blocks`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hisparse_plan.exchange.transfer.pattern.staging import StagedPattern
from hisparse_plan.exchange.transfer.program.transfer_program import copies


@dataclass(frozen=True, slots=True)
class LinkCosts:
    per_copy_s: float
    """What one more posted copy costs, past its bytes."""
    link_bytes_per_s: float
    local_bytes_per_s: float
    """The destination's local copy (the rearrangement)."""


LOOPBACK: Final = LinkCosts(per_copy_s=2.2e-6, link_bytes_per_s=11.0e9,
                            local_bytes_per_s=13.0e9)
"""NIXL over UCX between two agents of one host, DRAM to DRAM (nixl-cu12 1.5.1, this
project's 2-core development machine, idle), from the calibration line of
`benchmarks/bench_transfer.py --copy-speed`: DeepSeek-V3.2's 15,872 copies in 105 ms against
71 ms for one copy of their bytes (2.2 us a copy, 11 GB/s), a numpy copy at 13 GB/s. Here the
rearrangement costs as much as the link, so staging pays only for small copies."""
GPU_LINK: Final = LinkCosts(per_copy_s=4.0e-6, link_bytes_per_s=50.0e9,
                            local_bytes_per_s=1.5e12)
"""A 400 Gb/s RDMA link into an HBM GPU (per-copy cost as vllm#55434 reports for cuda_ipc);
the rearrangement runs at HBM speed."""


@dataclass(frozen=True, slots=True)
class Choice:
    staged: bool
    direct_s: float
    staged_s: float
    direct_copies: float
    staged_copies: float
    bytes: float
    slab_bytes: float

    def describe(self) -> str:
        kind = "staged" if self.staged else "direct"
        return (f"{kind}: per source block, direct {self.direct_copies:,.1f} copies of "
                f"{self.bytes:,.0f} B ~ {1e6 * self.direct_s:,.1f} us; staged "
                f"{self.staged_copies:,.2f} copies of {self.slab_bytes:,.0f} B + a local "
                f"rearrangement ~ {1e6 * self.staged_s:,.1f} us")


def choose(staged: StagedPattern, costs: LinkCosts = LOOPBACK, run_blocks: int = 16
           ) -> Choice:
    """The cheaper way to move `staged`'s pattern (module doc)."""
    pattern = staged.pattern
    copied = moved = 0.0
    for row in pattern.rows:
        link = pattern.links[row.link]
        blocks = link.period // link.source_units
        copied += copies(row) / blocks
        moved += row.length * row.count / blocks
    slab_copies = sum(1 / run_blocks if slab.length == slab.block_stride else 1
                      for slab in staged.slabs)
    slab_bytes = float(sum(slab.length for slab in staged.slabs))
    direct_s = copied * costs.per_copy_s + moved / costs.link_bytes_per_s
    staged_s = (slab_copies * costs.per_copy_s + slab_bytes / costs.link_bytes_per_s
                + moved / costs.local_bytes_per_s)
    return Choice(staged_s < direct_s, direct_s, staged_s, copied, slab_copies, moved,
                  slab_bytes)
