"""What each planning stage decided and why: the record `explain` renders. A record any target
may keep, so it lives beside them, not in one.

Tracing is off for plain `plan()` calls; `plan_traced()` turns it on. A decision's reason is a
callable, so an untraced plan never formats a string it would throw away.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Decision:
    """One number or choice: which stage made it, by which rule, and from what."""

    stage: str
    """group, size, admit, place or report."""
    rule: str
    """The rule's number, e.g. "7.3.2" (`rule_docs.rule_doc` gives its section of
    docs/planning-rules.md)."""
    subject: str
    """What was decided, e.g. "device_pools[0].bytes_per_block"."""
    value: object
    why: str
    """The formula with its inputs filled in."""


@dataclass(slots=True)
class Trace:
    enabled: bool = False
    decisions: list[Decision] = field(default_factory=list)

    def add(
        self, stage: str, rule: str, subject: str, value: object, why: str | Callable[[], str]
    ) -> None:
        """Record a decision; `why` is formatted only when tracing is on (callers in loops
        check `enabled` first and pass the string)."""
        if self.enabled:
            reason = why if isinstance(why, str) else why()
            self.decisions.append(Decision(stage, rule, subject, value, reason))
