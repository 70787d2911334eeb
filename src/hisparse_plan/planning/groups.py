"""Moved to `hisparse_plan.targets.vllm.groups`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.targets.vllm.groups import *  # noqa: F403

moved(__name__, "hisparse_plan.targets.vllm.groups")
