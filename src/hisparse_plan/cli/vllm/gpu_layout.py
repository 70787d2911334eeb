"""The device layout of a preset's or config.json's request: the one vLLM 0.34 resolves on the
deployment's GPU (`--gpu`, else compute capability 9.0), or the `--layout` asked for where vLLM
accepts it; then the plan held to the stride rules of the backends it runs on."""

from __future__ import annotations

import argparse
from typing import Final

from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.operator import Explanation
from hisparse_plan.operator.explain import Section, Step
from hisparse_plan.presets import Architecture, RegularArchitecture
from hisparse_plan.presets.hardware import find_gpu
from hisparse_plan.targets.vllm.platform import (
    Platform,
    Resolution,
    check_stride_contracts,
    resolve_platform,
    stride_contracts,
)

DEFAULT_CAPABILITY: Final = (9, 0)
"""Without --gpu the layout is resolved as on an H100/H200 (the placeholder memory is no GPU's)."""
RESOLVES_LAYOUT: Final = frozenset({"0.34"})
"""vLLM releases whose layout resolution these rules mirror; with --vllm 0.33 the request keeps
the preset's layout (BLNHC unless --layout)."""
SINK_MODELS: Final = frozenset({"gpt_oss"})
"""Model types whose attention layers keep sinks (vLLM's gpt-oss passes has_sink)."""


def platform_of(args: argparse.Namespace) -> Platform:
    gpu = getattr(args, "gpu", None)
    capability = DEFAULT_CAPABILITY
    if gpu is not None:
        found = find_gpu(gpu).compute_capability
        capability = found if found is not None else DEFAULT_CAPABILITY
    return Platform(capability, attention_backend=getattr(args, "attention_backend", None))


def resolve_for(args: argparse.Namespace, arch: Architecture, request: PlanRequest,
                explicit: bool) -> tuple[PlanRequest, Resolution]:
    """`request` with the layout vLLM resolves (unless one was asked for, which must be one vLLM
    accepts), and the resolution."""
    model_type = getattr(arch, "model_type", None)
    heads = getattr(arch, "num_attention_heads", None)
    tp = getattr(args, "tp", None) or 1
    resolution = resolve_platform(
        request, platform_of(args),
        requested=request.device.kv_cache_layout if explicit else None,
        sinks=isinstance(arch, RegularArchitecture) and model_type in SINK_MODELS,
        num_heads=None if heads is None else max(1, heads // tp))
    if not explicit:
        data = request.model_dump(mode="json")
        data["device"]["kv_cache_layout"] = resolution.layout.layout.value
        request = PlanRequest.model_validate(data)
    return request, resolution


def check_for(plan: KVCachePlan, request: PlanRequest, resolution: Resolution) -> None:
    """The plan against the stride rules of the backends it runs on."""
    check_stride_contracts(plan, request, stride_contracts(
        request, resolution.backends, resolution.platform.capability))


def backends_section(resolution: Resolution) -> Section:
    """`explain`'s account of the backends and the layout vLLM 0.34 takes on the GPU."""
    platform = resolution.platform
    chosen = ("--attention-backend " + platform.attention_backend
              if platform.attention_backend else "the first valid backend in vLLM's order")
    steps = [Step(name=f"backend of the {kind} layers", value=name,
                  formula=f"{chosen} on {platform.words} (vllm/platforms/cuda.py)",
                  inputs={"compute_capability": ".".join(map(str, platform.capability))})
             for kind, name in resolution.backends.items()]
    steps.append(Step(name="kv_cache_layout", value=resolution.layout.layout.value,
                      formula=resolution.layout.why + " (vllm/v1/attention/backends/utils.py)",
                      inputs={"candidates": ", ".join(resolution.layout.candidates)}))
    return Section(title="backends and layout (see docs/planning-rules.md#backends-and-layout)",
                   steps=steps)


def with_backends(explanation: Explanation, resolution: Resolution | None) -> Explanation:
    if resolution is None:
        return explanation
    return Explanation(sections=[backends_section(resolution), *explanation.sections])
