"""SGLang 0.5.23's platform queries answered as on a CUDA host with one GPU of a given compute
capability (SM90 H100/H200 or SM100 B200), for the reference harness (sglang_reference.py).

SGLang reads its machine in three ways, and each is answered here:

* ``runtime_context.get_platform()``: the facts the ``arg_groups`` hooks read (``is_cuda``,
  ``is_sm90``, ``is_sm100``, ``is_blackwell``, ``is_hopper_with_cuda_12_3``, ``device_sm``,
  ``has_flashinfer``, ...), installed through the platform's own override table;
* the compute-capability probes of ``sglang.srt.utils.common`` (``is_sm100_supported()``,
  ...), which a few hooks import and call themselves (``deepseek_v4_hook``, ``moe_hook``): the
  module's functions and every SGLang module's own binding of them are replaced;
* ``torch.cuda.get_device_capability`` and ``torch.version.cuda`` (the linear-attention hook
  compares the CUDA major).

Stand-ins that remain (no GPU exists on this machine): the GPU's memory comes from the case
(``memory``: the figures ``get_available_gpu_memory`` returns; ``gpu.total_memory_bytes``:
what nvidia-smi's total would be, else SGLang's own no-GPU fallback); the CUDA runtime is
taken as 12.8 (what ``is_hopper_with_cuda_12_3`` and the SM100 probes require; SGLang's
CUDA 13 paths, FlashInfer's GDN prefill on SM100, are not taken); FlashInfer counts as
installed (SGLang's CUDA wheels depend on it); the pools are built on ``meta``, and
``torch.cuda.is_available()`` and ``utils.common.is_cuda()`` stay False: the modules that
test them at import choose their kernels by it (``_is_cuda = is_cuda()`` then ``sgl_kernel``,
which is not installed here); the resolution hooks ask ``get_platform()`` instead. The other
stand-ins (the model registry read from source, a bare model namespace, the process groups)
are sglang_reference.py's, listed there.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any, TypeAlias

SGLangObject: TypeAlias = Any
"""An object of SGLang or torch (both untyped in the project venv)."""

HOPPER = (9, 0)
"""The GPU when a case names none: an H200 (SM90), the project's default."""
CUDA_VERSION = "12.8"

_PROBES = {
    # utils.common probe -> the capability majors it is true for
    "is_sm90_supported": (9,),
    "is_hopper_with_cuda_12_3": (9,),
    "is_sm100_supported": (10,),
    "is_sm100_or_sm110_supported": (10, 11),
    "is_sm110_supported": (11,),
    "is_sm120_supported": (12,),
    "is_blackwell_supported": (10, 11, 12),
    "is_blackwell": (10, 11, 12),
}
_NOT_CUDA = ("is_hip", "is_npu", "is_xpu", "is_musa", "is_mps")

_ORIGINALS: dict[str, Any] = {}


def platform_facts(capability: tuple[int, int]) -> dict[str, Any]:
    """What ``get_platform()`` answers on a CUDA GPU of `capability`."""
    major, minor = capability
    return {
        "is_cuda": True,
        **dict.fromkeys(_NOT_CUDA, False),
        "is_sm90": major == 9,
        "is_hopper_with_cuda_12_3": major == 9,
        "is_sm100": major == 10,
        "is_sm100_or_sm110": major in (10, 11),
        "is_sm110": major == 11,
        "is_sm120": major == 12,
        "is_blackwell": major in (10, 11, 12),
        "has_flashinfer": True,
        "has_amx": False,
        "device_sm": major * 10 + minor,
        "device_capability": (major, minor),
    }


def _answer(name: str, value: bool) -> Callable[..., bool]:
    def probe(*_args: object, **_kwargs: object) -> bool:
        return value

    probe.__probe__ = name  # type: ignore[attr-defined]
    return probe


def _replace_probes(capability: tuple[int, int]) -> list[str]:
    """utils.common's probes, and each SGLang module's binding of one (the original function
    or an earlier case's answer)."""
    common: SGLangObject = sys.modules["sglang.srt.utils.common"]
    originals = _ORIGINALS.setdefault("probes", {
        id(getattr(common, name)): name for name in _PROBES if hasattr(common, name)})
    major = capability[0]
    answers: dict[str, bool] = {name: major in majors for name, majors in _PROBES.items()}
    rebound = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("sglang.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            name = originals.get(id(value))
            if name is None and isinstance(value, types.FunctionType):
                name = getattr(value, "__probe__", None)
            if name is None or name not in answers:
                continue
            setattr(module, attr, _answer(name, answers[name]))
            if module is not common:
                rebound.append(f"{module_name}.{attr}")
    return rebound


def install(capability: tuple[int, int] | None, torch: SGLangObject) -> str:
    """Answer SGLang's platform queries as a CUDA GPU of `capability` (HOPPER when None);
    returns the line for the report's ``patched`` list. Each case installs its own (several
    cases share a process)."""
    rc: SGLangObject = importlib.import_module("sglang.srt.runtime_context")
    importlib.import_module("sglang.srt.utils.common")
    cap = HOPPER if capability is None else (int(capability[0]), int(capability[1]))
    facts = platform_facts(cap)
    overrides = object.__getattribute__(rc.get_platform(), "_overrides")
    overrides.clear()
    rc.get_platform()._install(**facts)
    rebound = _replace_probes(cap)
    torch.cuda.get_device_capability = lambda device=None: cap
    torch.version.cuda = CUDA_VERSION
    given = "" if capability is not None else " (none given: H200)"
    return (f"CUDA host, SM{cap[0]}{cap[1]}{given}, CUDA {CUDA_VERSION}: platform facts "
            + ", ".join(k for k, v in facts.items() if v is True)
            + f"; utils.common probes and {len(rebound)} module bindings of them; "
            "torch.cuda.get_device_capability")
