"""Moved to `hisparse_plan.torch.vllm.verification`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.torch.vllm.verification import *  # noqa: F403

moved(__name__, "hisparse_plan.torch.vllm.verification")
