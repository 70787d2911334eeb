"""gpu_check section 16, staged transfers on the GPU (issue 41): each pair moved in one
process with the torch executor, staged (stage_round + rearrange_round, every round) and
direct (execute_request), both against one copy of the same bytes between the same memories
(a cudaMemcpy through Tensor.copy_), every byte of the two results compared:
- DeepSeek-V3.2 BLNHC prefill on the GPU into a vLLM HiSparse decode (index keys in its
  device pool, latent rows in its pinned host pool; staging in pinned host memory, where most
  of the bytes land);
- Llama-3-70B TP 2 -> TP 1, BLNHC on both sides, all on the GPU (staging in device memory).
With --device cpu it is a dry run of the same code on small pools."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

import hisparse_plan as hp
from bench_transfer import in_runs
from hisparse_plan.exchange.transfer import (
    Instance,
    TransferRequest,
    check_staged,
    compile_staged,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.pattern.staging import slots_for
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.torch.transfer import execute_request, rearrange_round, stage_round

GIB = 2**30


def _timed(device: torch.device, action: Callable[[], object]) -> float:
    action()  # warm-up: kernels loaded, pages touched
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    action()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def _regions(ranks: Any, device: torch.device, pinned: bool, seed: int  # noqa: ANN401
             ) -> dict[tuple[int, str], torch.Tensor]:
    """A uint8 tensor per region, random bytes, on the device or in (pinned) host memory as
    the region's location says."""
    generator = torch.Generator().manual_seed(seed)
    found = {}
    for rank in ranks:
        for region in rank.regions:
            data = torch.randint(0, 256, (region.size,), dtype=torch.uint8, generator=generator)
            if region.location == "device":
                data = data.to(device)
            elif pinned:
                data = data.pin_memory()
            found[(rank.rank, region.name)] = data
    return found


def staged_pair(name: str, src: Instance, dst: Instance, tokens: int, device: torch.device,
                check: Callable[[str, bool, str], None]) -> None:
    pinned = device.type == "cuda"
    pattern = compile_transfer(src, dst)
    staged = compile_staged(pattern, slots_for(pattern, GIB))
    check_staged(staged, src, dst)
    blocks = in_runs(16)
    request = TransferRequest(num_tokens=tokens, source_blocks=blocks(src.plans[0], tokens),
                              destination_blocks=blocks(dst.plans[0], tokens))
    made = staged.instantiate(request)
    source = _regions(pattern.source, device, pinned, 41)
    direct = _regions(pattern.destination, device, pinned, 42)
    ours = {key: value.clone() for key, value in direct.items()}
    staging = _regions(made.staging_regions(), device, pinned, 43)

    def staged_run() -> None:
        for round_ in made.rounds:
            stage_round(made, round_, source, staging)
            rearrange_round(made, round_, staging, ours)

    staged_s = _timed(device, staged_run)
    direct_s = _timed(device, lambda: execute_request(made.direct, source, direct))
    target = next(iter(staging.values()))
    origin = max(source.values(), key=lambda t: t.numel())
    size = min(made.bytes, target.numel(), origin.numel())
    one_s = _timed(device, lambda: target[:size].copy_(origin[:size])) * made.bytes / size
    same = all(torch.equal(ours[key], direct[key]) for key in direct)
    rounds = len(made.rounds)
    check(f"staged transfer: {name}", same,
          f"{made.bytes / 1e6:.0f} MB in {rounds} rounds: staged {1e3 * staged_s:.1f} ms "
          f"({staged_s / one_s:.2f} x one copy), direct {1e3 * direct_s:.1f} ms "
          f"({direct_s / one_s:.2f} x), one copy {1e3 * one_s:.1f} ms; the two results "
          + ("equal" if same else "DIFFER"))


def staged_transfers(device_name: str, check: Callable[[str, bool, str], None],
                     tokens: int = 16384) -> None:
    device = torch.device(device_name)
    if device.type == "cpu":
        tokens = 1024
    row = 61 * 800
    plans = []
    for hisparse in (False, True):
        settings = Settings(layout=KVCacheLayout.BLNHC, hisparse=hisparse,
                            gpu_mem_bytes=tokens * (64_000 if hisparse else row) * 5 // 4
                            + (GIB // 4 if hisparse else 0),
                            host_pool_bytes=tokens * row * 5 // 4 if hisparse else None,
                            max_model_len=tokens)
        plans.append(hp.plan(build_request(load_preset("deepseek-v3.2").architecture,
                                           settings)))
    staged_pair("DeepSeek-V3.2 BLNHC prefill -> vLLM HiSparse decode", Instance([plans[0]]),
                Instance([plans[1]]), tokens, device, check)
    per_token = 80 * 8 * 128 * 2 * 2
    llama = [hp.plan(build_request(load_preset("llama-3-70b").architecture, Settings(
        layout=KVCacheLayout.BLNHC, tp=tp, max_model_len=tokens,
        gpu_mem_bytes=tokens * per_token // tp * 5 // 4))) for tp in (2, 1)]
    staged_pair("Llama-3-70B TP 2 -> TP 1, BLNHC", Instance([llama[0], llama[0]]),
                Instance([llama[1]]), tokens, device, check)
