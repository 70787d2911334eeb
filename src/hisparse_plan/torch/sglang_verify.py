"""Moved to `hisparse_plan.torch.sglang.verify`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.torch.sglang.verify import *  # noqa: F403

moved(__name__, "hisparse_plan.torch.sglang.verify")
