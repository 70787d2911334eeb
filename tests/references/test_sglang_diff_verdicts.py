"""references/sglang_diff.py's verdicts on a refusal of SGLang's: a package this host lacks
makes the case unusable here (counted apart, never as agreeing, never hiding a refusal of
SGLang's own checks); any other refusal of SGLang's that ours does not share is a mismatch."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import pytest

from support import paths

REFERENCES = paths.REPO / "references"


@pytest.fixture(scope="module")
def diff() -> ModuleType:
    sys.path.insert(0, str(REFERENCES))
    try:
        return importlib.import_module("sglang_diff")
    finally:
        sys.path.remove(str(REFERENCES))


# SGLang 0.5.23's own messages on this host (references/sglang_reference.py).
ABSENT = [
    "ModuleNotFoundError: No module named 'torch_memory_saver'",
    "ValueError: --enable-http2 requires the 'granian' package. Install it with: pip install",
    "ValueError: --enable-nvidia-megakernel cannot run this setup:\n  - the "
    "'nvidia_megakernel' plugin is not installed; install sgl-nvidia-mega",
    "ValueError: FlashInfer mamba module not available, please check the FlashInfer "
    "installation.",
    "ValueError: --linear-attn-prefill-backend flashinfer on SM100+ requires CUDA 13+, "
    "got CUDA 12.8",
]


@pytest.mark.parametrize("message", ABSENT)
def test_a_package_absent_here_is_unusable_here(diff: ModuleType, message: str) -> None:
    assert diff.compare({"page_size": 1}, {"refused": message}) == diff.UNUSABLE_HERE
    assert diff.compare({"refused": "x"}, {"refused": message}) == diff.UNUSABLE_HERE


@pytest.mark.parametrize("message", [
    "ValueError: --dcp-comm-backend fi_a2a only affects the decode context-parallel ...",
    "ModuleNotFoundError: No module named 'sglang.srt.other'",
])
def test_other_refusals_of_sglang_are_mismatches(diff: ModuleType, message: str) -> None:
    assert diff.compare({"page_size": 1}, {"refused": message}).startswith(
        "mismatch: SGLang refuses")
    assert diff.compare({"refused": "x"}, {"refused": message}) == "both refuse"
