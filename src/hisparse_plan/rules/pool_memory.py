"""Moved to `hisparse_plan.targets.vllm.rules.pool_memory`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.targets.vllm.rules.pool_memory import *  # noqa: F403

moved(__name__, "hisparse_plan.targets.vllm.rules.pool_memory")
