"""vLLM's own planning rules (docs/planning-rules.md) as small pure functions: no planning
state, no I/O. vLLM's stages and the checker both call these, so each rule is written once."""
