"""`max_model_len auto` for HiSparse: the longest length whose plan fits the pools.

The planner auto-fits regular plans itself (the admission stage shortens max_model_len). A
HiSparse plan is not auto-fitted there; this finds the same answer from outside: the longest
max_model_len, up to the requested one, that the planner admits. Admission is monotone in the
length (a longer request never needs fewer blocks of any pool), so a bisection finds it.
"""

from __future__ import annotations

from hisparse_plan.errors import CapacityError
from hisparse_plan.models import PlanRequest
from hisparse_plan.planning import plan as make_plan


def _with_length(request: PlanRequest, length: int) -> PlanRequest:
    data = request.model_dump(mode="json")
    data["model"]["max_model_len"] = length
    return PlanRequest.model_validate(data)


def _admitted(request: PlanRequest) -> bool:
    try:
        make_plan(request)
    except CapacityError:
        return False
    return True


def longest_fitting_request(request: PlanRequest) -> PlanRequest:
    """`request` with the longest max_model_len (at most its own) whose plan the pools admit;
    a CapacityError when not even one token fits."""
    if _admitted(request):
        return request
    fits, misses = 0, request.model.max_model_len
    while misses - fits > 1:
        middle = (fits + misses) // 2
        if _admitted(_with_length(request, middle)):
            fits = middle
        else:
            misses = middle
    if fits == 0:
        make_plan(_with_length(request, 1))  # raises the planner's own reason
    return _with_length(request, fits)
