"""Operator logic: capacity against the all-GPU baseline, sweeps, host-pool tuning, deployments,
plans explained. May import models, presets, checking and targets (the default engine's).

Pure functions returning models; nothing here prints.
"""

from hisparse_plan.operator.baseline import (
    BaselineCapacity,
    RegularCapacity,
    all_gpu_request,
    baseline_capacity,
    baseline_plan,
    regular_capacity,
)
from hisparse_plan.operator.bounds import Binding, GroupDemand, Metric, PoolBounds, pool_bounds
from hisparse_plan.operator.compare import (
    CapacityComparison,
    compare,
    compare_plan,
    fitted_request,
)
from hisparse_plan.operator.deployments import (
    Deployment,
    DeploymentComparison,
    DeploymentResult,
    RankMemory,
    compare_deployments,
    deployment_grid,
)
from hisparse_plan.operator.explain import Explanation, Section, Step, explain
from hisparse_plan.operator.schema import json_schemas
from hisparse_plan.operator.sweep import (
    SWEEP_AXES,
    Sweep,
    SweepAxis,
    SweepPoint,
    default_points,
    sweep,
)
from hisparse_plan.operator.tune import (
    BestTune,
    HostPoolTune,
    TuneResult,
    best_concurrency,
    smallest_host_pool,
)

__all__ = [
    "SWEEP_AXES",
    "BaselineCapacity",
    "BestTune",
    "Binding",
    "CapacityComparison",
    "Deployment",
    "DeploymentComparison",
    "DeploymentResult",
    "Explanation",
    "GroupDemand",
    "HostPoolTune",
    "Metric",
    "PoolBounds",
    "RankMemory",
    "RegularCapacity",
    "Section",
    "Step",
    "Sweep",
    "SweepAxis",
    "SweepPoint",
    "TuneResult",
    "all_gpu_request",
    "baseline_capacity",
    "baseline_plan",
    "best_concurrency",
    "compare",
    "compare_deployments",
    "compare_plan",
    "default_points",
    "deployment_grid",
    "explain",
    "fitted_request",
    "json_schemas",
    "pool_bounds",
    "regular_capacity",
    "smallest_host_pool",
    "sweep",
]
