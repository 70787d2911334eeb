"""Transfer programs for one long request (issue 29): descriptors per request and the time to
build and prove the program, for DeepSeek-V3.2 and GLM-5, per layout of the prefill's pool.

    .venv/bin/python benchmarks/bench_transfer.py [--tokens N] [--repeat K]

Each prefill (vLLM, no HiSparse, 80 GiB of KV, one of the layouts that pack latent rows
beside index keys) moves one request to three decodes: vLLM with HiSparse (index keys on the
GPU in BLNHC, latent rows in the layer-outermost pinned host pool), vLLM without HiSparse in
the prefill's layout, and SGLang (per-layer buffers, 656-byte fp8 rows). The request's blocks
are one run on each side, runs of 16 blocks, or shuffled. `rows` is what the program lists,
`descriptors` the contiguous copies (what NIXL posts: a row whose chunks follow one another
is one, any other row one per chunk), each also per run of consecutive blocks (the request's
runs: the more fragmented side's). Build and prove are the medians of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from itertools import pairwise

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import (
    Instance,
    TransferProgram,
    TransferRequest,
    build_transfer,
    check_transfer,
    tables,
)
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.presets import Settings, build_request, load_preset

GIB = 2**30
LAYOUTS = (KVCacheLayout.BLNHC, KVCacheLayout.BLHNC, KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)
Blocks = Callable[[Plan, int], dict[str, list[int]]]


def vllm(model: str, layout: KVCacheLayout, hisparse: bool) -> Plan:
    settings = Settings(layout=layout, gpu_mem_bytes=80 * GIB, hisparse=hisparse,
                        host_pool_bytes=400 * GIB if hisparse else None)
    return hp.plan(build_request(load_preset(model).architecture, settings))


def sglang(model: str) -> Plan:
    from hisparse_plan.adapters.sglang.request import sglang_request
    from hisparse_plan.models.sglang_settings import SGLangSettings

    engine = SGLangSettings(name="sglang", context_length=163840, kv_cache_dtype="fp8_e4m3",
                            max_running_requests=8)
    request = sglang_request(load_preset(model).architecture, engine, available_bytes=80 * GIB)
    return hp.plan_for_engine(request)


def in_runs(run: int | None, shuffle: bool = False) -> Blocks:
    """Each table's blocks: one run, runs of `run` ids one apart, or shuffled ids."""
    def blocks(plan: Plan, tokens: int) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        start: dict[int, int] = {}
        for key, table in tables(plan).items():
            count = 1 if table.state else -(-tokens // table.block_tokens)
            first = start.get(table.num_blocks, table.padding_blocks)
            if shuffle:
                ids = random.Random(count).sample(range(first, table.num_blocks), count)
            else:
                step = run or count
                ids = [first + i + i // step for i in range(count)]
            start[table.num_blocks] = max(ids) + 1
            found[key] = ids
        return found
    return blocks


def timed(work: Callable[[], object], repeat: int) -> tuple[object, float]:
    samples, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = work()
        samples.append(time.perf_counter() - started)
    return result, statistics.median(samples)


def measure(source: Plan, destination: Plan, blocks: Blocks, tokens: int, repeat: int
            ) -> tuple[TransferProgram, float, float, int]:
    request = TransferRequest(num_tokens=tokens, source_blocks=blocks(source, tokens),
                              destination_blocks=blocks(destination, tokens))
    src, dst = Instance([source]), Instance([destination])
    program, build = timed(lambda: build_transfer(src, dst, request), repeat)
    assert isinstance(program, TransferProgram)
    _, prove = timed(lambda: check_transfer(program, src, dst), repeat)
    runs = max(_runs(ids) for ids in request.source_blocks.values())
    runs = max(runs, *(_runs(ids) for ids in request.destination_blocks.values()))
    return program, build, prove, runs


def _runs(ids: list[int]) -> int:
    return 1 + sum(1 for a, b in pairwise(ids) if b != a + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=163840)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blocks", default="one run,runs 16,shuffled",
                        help="which block patterns, comma-separated")
    args = parser.parse_args()
    print(f"{'model':<14} {'prefill':<7} {'decode':<14} {'blocks':<9} {'rows':>7} "
          f"{'per run':>8} {'descriptors':>11} {'per run':>8} {'GiB':>6} {'build':>9} "
          f"{'prove':>9}")
    for model in ("deepseek-v3.2", "glm-5"):
        hisparse, other = vllm(model, KVCacheLayout.BLNHC, True), sglang(model)
        for layout in LAYOUTS:
            prefill = vllm(model, layout, False)
            decodes = (("vLLM HiSparse", hisparse), ("vLLM same", prefill), ("SGLang", other))
            for decode_name, destination in decodes:
                patterns = (("one run", in_runs(None)), ("runs 16", in_runs(16)),
                            ("shuffled", in_runs(None, shuffle=True)))
                for blocks_name, blocks in patterns:
                    if blocks_name not in args.blocks.split(","):
                        continue
                    program, build, prove, runs = measure(prefill, destination, blocks,
                                                          args.tokens, args.repeat)
                    print(f"{model:<14} {layout.value:<7} {decode_name:<14} {blocks_name:<9} "
                          f"{len(program.rows):>7} {len(program.rows) / runs:>8.1f} "
                          f"{program.descriptors:>11} {program.descriptors / runs:>8.1f} "
                          f"{program.bytes / GIB:>6.2f} {build * 1e3:>7.0f}ms "
                          f"{prove * 1e3:>7.0f}ms", flush=True)


if __name__ == "__main__":
    main()
