"""Moved to `hisparse_plan.torch.hostmem.numa`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.torch.hostmem.numa import *  # noqa: F403

moved(__name__, "hisparse_plan.torch.hostmem.numa")
