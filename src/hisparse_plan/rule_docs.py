"""Where the docs that ship with the package explain each planning rule.

The planner's trace records each decision with the internal rule number it applied (e.g.
"7.3.2 step 1"); people read the rule in `docs/planning-rules.md` instead, at the anchor this
maps it to. The docs are in the source tree and, installed, in `hisparse_plan/docs/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from hisparse_plan.errors import PlanError

RULES_DOC: Final = "docs/planning-rules.md"
CONTRACT_DOC: Final = "docs/plan-contract.md"

ANCHORS: Final[tuple[tuple[str, str], ...]] = (
    ("7.3.1", "packed-groups"), ("7.3.2", "unified-pages"),
    ("7.3.3", "full-allocation-fallback"), ("7.3", "grouping"),
    ("5.10", "capacity"), ("5.11", "invariants"), ("5.12", "admission"), ("5.13", "pages"),
    ("5.1", "pages"), ("5.2", "hisparse-groups"), ("5.3", "hisparse-groups"),
    ("5.4", "hot-buffer"), ("5.5", "resident-and-hot-packs"), ("5.6", "hisparse-groups"),
    ("5.7", "host-pool"), ("5.8", "device-pool"), ("5.9", "placement"),
    ("7.1", "pages"), ("7.2", "families"), ("7.4", "device-pool"), ("7.5", "placement"),
    ("7.6", "pipeline-stages"), ("7.7", "admission"), ("7.8", "auto-fit"),
    ("7.9", "capacity"), ("7.11", "deferred-modes"), ("7.12", "window-merges"),
    ("7.13", "engine-modes"), ("7.14", "cross-layer-kv-sharing"), ("4.1", "requests"),
    ("4", "requests"),
    ("sglang.pools", "sglang-pools"), ("sglang.budget", "sglang-budget"),
    ("sglang.capacity", "sglang-capacity"),
    ("sglang.speculative", "sglang-speculative-decoding"),
)
"""Internal rule numbers (SGLang's by the section of its rules: "sglang.budget"), longest first
where one is a prefix of another, to anchors."""

SECTIONS: Final = frozenset(prefix.split(".")[0] for prefix, _ in ANCHORS
                            if not prefix[0].isdigit())
"""The named sections of rules (an engine's, "sglang.pools"): a rule of one whose own part has
no anchor above is read at the section's heading, whose anchor is the section's name."""


def rule_doc(rule: str) -> str:
    """The doc and anchor for an internal rule reference: `"5.12 / 7.7"` (the first number
    decides), `"7.3.2 step 1"`; the rules page itself when the number is not known."""
    number = rule.replace("/", " ").split()[0] if rule.strip() else ""
    if number in ("6", "6.1"):
        return CONTRACT_DOC
    for prefix, anchor in ANCHORS:
        if number == prefix or number.startswith(prefix + "."):
            return f"{RULES_DOC}#{anchor}"
    section = number.split(".")[0]
    if section in SECTIONS:
        return f"{RULES_DOC}#{section}"
    return RULES_DOC


DOC_NAMES: Final = (
    "planning-rules", "plan-contract", "glossary", "cli", "presets", "library", "backend",
    "engines", "recipe-vllm", "recipe-sglang", "transfer", "connector", "versions-and-modes",
    "promises", "architecture", "vllm-registry", "vllm-transformers-sweep",
)
"""Every page of docs/: the two that messages cite first, then the guides in reading order.
Each ships in the wheel under hisparse_plan/docs/ (pyproject's force-include)."""


def doc_path(name: str) -> Path:
    """Where the doc `name` (one of DOC_NAMES) is: inside the installed package
    (`hisparse_plan/docs/`, where the wheel puts it), else in a source checkout's `docs/`."""
    if name not in DOC_NAMES:
        raise PlanError(f"docs: expected one of {', '.join(DOC_NAMES)}, got {name!r}",
                        field="docs")
    packaged = Path(__file__).resolve().parent / "docs" / f"{name}.md"
    if packaged.is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "docs" / f"{name}.md"
    if checkout.is_file():
        return checkout
    raise PlanError(f"docs: {name}.md is neither in the package nor beside it; reinstall "
                    "hisparse-plan", field="docs")
