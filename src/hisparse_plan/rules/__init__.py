"""Formulas every engine's plan shares: exact integer arithmetic (`arith`), axis strides and page
extents (`strides`). May import models only.

Small pure functions (docs/planning-rules.md). A rule only one engine's planner uses lives in
that engine's target (`hisparse_plan.targets.vllm.rules` for vLLM's).
"""
