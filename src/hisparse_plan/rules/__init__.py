"""Formulas every engine's plan shares (docs/planning-rules.md), as small pure functions: exact
integer arithmetic (`arith`) and the byte strides and page extents of a tensor's axes in a
layout (`strides`). A rule only one engine's planner uses lives in that engine's target
(`hisparse_plan.targets.vllm.rules` for vLLM's)."""
