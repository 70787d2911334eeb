"""Moved to `hisparse_plan.targets.vllm.one_manager`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.targets.vllm.one_manager import *  # noqa: F403

moved(__name__, "hisparse_plan.targets.vllm.one_manager")
