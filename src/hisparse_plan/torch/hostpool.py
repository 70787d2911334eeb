"""Split: the host pool's state and undo are now `hisparse_plan.torch.hostmem.state` (NUMA
placement of an attached pool in `hostmem.numa`), and a vLLM plan's host pool size and views
`hisparse_plan.torch.vllm.host`. This old path re-exports what it held, with a
DeprecationWarning."""

from hisparse_plan._moved import deprecated_path
from hisparse_plan.torch.hostmem.numa import attached_placement
from hisparse_plan.torch.hostmem.state import (
    STRANDED,
    HostState,
    describe,
    suppress_close_errors,
)
from hisparse_plan.torch.vllm.host import check_host_views, check_shared, host_pool_bytes

deprecated_path(__name__, "hisparse_plan.torch.hostmem.state and hisparse_plan.torch.vllm.host")

__all__ = [
    "STRANDED",
    "HostState",
    "attached_placement",
    "check_host_views",
    "check_shared",
    "describe",
    "host_pool_bytes",
    "suppress_close_errors",
]
