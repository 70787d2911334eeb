"""Every golden case comes out exactly; every golden rejection is a PlanError."""

from __future__ import annotations

import filecmp
import json
import logging
import warnings

import pytest

import hisparse_plan as hp
from support.golden import CASES, GOLDEN, SHARED, VENDORED, load, project


@pytest.mark.parametrize("case", CASES)
def test_golden_case(case: str) -> None:
    request, expected = load(case)
    if expected.get("error"):
        with pytest.raises(hp.PlanError) as refused:
            hp.plan(request)
        assert str(refused.value)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of the golden cases wastes hot rows
        plan = hp.plan(request)
    assert project(plan.model_dump(mode="json")) == expected
    hp.check_plan(plan)


def test_golden_cases_are_all_there() -> None:
    assert len(CASES) >= 9
    assert {"deepseek_v32_fp8", "bf16_small_with_full_attention"} <= set(CASES)


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared golden folder beside this checkout")
def test_vendored_copy_matches_the_shared_cases() -> None:
    """tests/golden is the copy CI uses; it must not drift from the shared cases."""
    shared = sorted(path.name for path in SHARED.iterdir())
    assert sorted(path.name for path in VENDORED.iterdir()) == shared
    _, mismatch, errors = filecmp.cmpfiles(SHARED, VENDORED, shared, shallow=False)
    assert (mismatch, errors) == ([], [])
    assert GOLDEN == SHARED


def test_worked_example_numbers() -> None:
    """SPEC section 8, number by number."""
    request, _ = load("deepseek_v32_fp8")
    plan = hp.plan(request)
    assert plan.groups[0].spec.page_size_bytes == 61 * 41984
    assert plan.groups[1].spec.page_size_bytes == 515328
    assert [len(g.layer_names) for g in plan.groups[2:8]] == [12, 12, 12, 12, 12, 1]
    assert plan.groups[8].spec.kind == "hisparse_hot"
    assert plan.groups[8].spec.blocks_per_request == 64
    assert plan.host_pool is not None
    assert (plan.host_pool.block_stride, plan.host_pool.num_blocks) == (2561024, 26832)
    assert (plan.device_pool.bytes_per_block, plan.num_blocks) == (545792, 118038)
    host_tensor = plan.tensors[0]
    assert (host_tensor.layer_stride, host_tensor.block_stride) == (1126514688, 41984)
    assert plan.capacity.max_concurrency == pytest.approx(10.48125)
    assert plan.capacity.steady_state_concurrency == pytest.approx(10.48125)


def test_packaged_example_is_the_deepseek_golden_request() -> None:
    example = (VENDORED.parent.parent / "src" / "hisparse_plan" / "data"
               / "deepseek_v32_fp8.request.json")
    assert json.loads(example.read_text()) == load("deepseek_v32_fp8")[0]


def test_a_plan_logs_one_summary_line_at_info(caplog: pytest.LogCaptureFixture) -> None:
    request, _ = load("regular_llama3_70b_pp4_autofit")
    with caplog.at_level(logging.INFO, logger="hisparse_plan"):
        plan = hp.plan(request)
    lines = [r.getMessage() for r in caplog.records if r.name == "hisparse_plan"]
    assert lines == [
        f"planned 1 groups in 4 device pool(s) of {' + '.join(['9662627840 B'] * 4)} "
        "(7372 blocks), max_model_len fitted to 117936; max concurrency 1"
    ]
    assert plan.fingerprint == hp.plan(request).fingerprint
