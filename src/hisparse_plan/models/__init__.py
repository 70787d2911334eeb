"""The pydantic models: requests in, plans out."""

from hisparse_plan.models.base import INT64_MAX
from hisparse_plan.models.dtypes import DTYPE_SIZE, DType, dtype_size
from hisparse_plan.models.group_specs import (
    GroupSpec,
    HisparseHotSpec,
    HisparseResidentSpec,
    UniformTypeSpec,
)
from hisparse_plan.models.layer_specs import (
    AttentionLayerSpec,
    FullAttentionSpec,
    LayerSpec,
    MLASpec,
    SlidingWindowSpec,
)
from hisparse_plan.models.layout import Axis, KVCacheLayout
from hisparse_plan.models.plan import (
    Capacity,
    DevicePool,
    GroupRole,
    HostPool,
    KVCacheGroup,
    KVCachePlan,
    KVCacheTensor,
    Workload,
)
from hisparse_plan.models.request import (
    HOT_SUFFIX,
    RESIDENT_SUFFIX,
    DeviceConfig,
    HisparseConfig,
    ModelConfig,
    PlanRequest,
    SchedulerConfig,
)

__all__ = [
    "DTYPE_SIZE",
    "HOT_SUFFIX",
    "INT64_MAX",
    "RESIDENT_SUFFIX",
    "AttentionLayerSpec",
    "Axis",
    "Capacity",
    "DType",
    "DeviceConfig",
    "DevicePool",
    "FullAttentionSpec",
    "GroupRole",
    "GroupSpec",
    "HisparseConfig",
    "HisparseHotSpec",
    "HisparseResidentSpec",
    "HostPool",
    "KVCacheGroup",
    "KVCacheLayout",
    "KVCachePlan",
    "KVCacheTensor",
    "LayerSpec",
    "MLASpec",
    "ModelConfig",
    "PlanRequest",
    "SchedulerConfig",
    "SlidingWindowSpec",
    "UniformTypeSpec",
    "Workload",
    "dtype_size",
]
