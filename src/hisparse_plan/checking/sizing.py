"""Moved to `hisparse_plan.checking.vllm.sizing`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.checking.vllm.sizing import *  # noqa: F403

moved(__name__, "hisparse_plan.checking.vllm.sizing")
