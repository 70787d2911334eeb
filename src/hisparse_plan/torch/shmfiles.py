"""Moved to `hisparse_plan.torch.hostmem.shmfiles`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.torch.hostmem.shmfiles import *  # noqa: F403

moved(__name__, "hisparse_plan.torch.hostmem.shmfiles")
