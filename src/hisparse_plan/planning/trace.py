"""Moved to `hisparse_plan.targets.trace`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.targets.trace import *  # noqa: F403

moved(__name__, "hisparse_plan.targets.trace")
