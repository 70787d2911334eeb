"""vLLM's own planning rules (docs/planning-rules.md), small pure functions the stages and the
checker both call. May import models, rules and the target's own modules.

No planning state, no I/O: each rule is written once.
"""
