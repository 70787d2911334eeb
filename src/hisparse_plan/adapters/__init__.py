"""Bridges between hisparse_plan and inference engines (`vllm/`, `sglang/`, each behind its extra).
May import models, presets, rules, checking, targets, torch; an engine's part never the other's."""
