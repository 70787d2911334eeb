"""Moved to `hisparse_plan.torch.sglang.pools`:
this old path imports it, with a DeprecationWarning."""

from hisparse_plan._moved import moved
from hisparse_plan.torch.sglang.pools import *  # noqa: F403

# What a star import leaves out, named for type checkers that read this path; at run time the
# module under this name is the new one (`moved`), private names and all.
from hisparse_plan.torch.sglang.pools import _check_device_memory as _check_device_memory

moved(__name__, "hisparse_plan.torch.sglang.pools")
