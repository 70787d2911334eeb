"""Every public entry point lets out only the PlanError family, or a ValidationError about the
caller's own input: the planners, the SGLang adapter (pool_kwargs and report on any plan
check_plan accepts), and either engine's functions given the other engine's plan."""

from __future__ import annotations

import copy
import json
import re
import types
import warnings
from collections.abc import Callable
from functools import cache, partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from test_extremes import _sglang

import hisparse_plan as hp
from hisparse_plan.adapters import sglang as sglang_adapter
from hisparse_plan.adapters.vllm import request_from_vllm, to_kv_cache_config, to_kv_cache_configs
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.presets import Architecture, load_preset
from hisparse_plan.targets.sglang import plan_sglang
from hisparse_plan.targets.vllm import plan_traced
from hisparse_plan.views import plan_views, tensor_views
from support.golden import GOLDEN

KINDS: list[tuple[str, dict[str, Any]]] = [
    ("mha", {}), ("mha_kv_apart", {}), ("window", {}), ("mla", {}), ("dsa", {}),
    ("dsa", {"enable_hisparse": True}), ("mamba", {}), ("deepseek_v4", {}),
]
"""A small plan of every SGLang pool kind (the names are test_extremes' models)."""


@cache
def sglang_plan(index: int) -> dict[str, Any]:
    kind, engine = KINDS[index]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        return hp.plan_for_engine(_sglang(kind, **engine)).model_dump(mode="json")


@cache
def vllm_plan() -> hp.KVCachePlan:
    request = json.loads((GOLDEN / "glm5_fp8_blhnc.request.json").read_text())
    return hp.plan(request)


def _tensor_of(plan: dict[str, Any], pool: str) -> dict[str, Any]:
    tensor: dict[str, Any] = next(t for t in plan["tensors"] if t["pool"] == pool)
    return tensor


def _renamed_pool(plan: dict[str, Any], old: str, new: str) -> None:
    for pool in plan["pools"]:
        if pool["name"] == old:
            pool["name"] = new
    for tensor in plan["tensors"]:
        if tensor["pool"] == old:
            tensor["pool"] = new


def _no_views(plan: dict[str, Any], pool: str) -> None:
    _tensor_of(plan, pool)["views"] = []


def _view_renamed(plan: dict[str, Any], pool: str) -> None:
    _tensor_of(plan, pool)["views"][0]["name"] = "renamed"


def _view_flattened(plan: dict[str, Any], pool: str) -> None:
    """The view's last two axes as one: the same bytes, one axis fewer."""
    view = _tensor_of(plan, pool)["views"][0]
    view["shape"] = [*view["shape"][:-2], view["shape"][-2] * view["shape"][-1]]
    view["strides"] = [*view["strides"][:-2], view["strides"][-1]]


def _long_layer_number(plan: dict[str, Any], pool: str) -> None:
    tensor = _tensor_of(plan, pool)
    tensor["layers"] = ["model.layers." + "7" * 5000 + ".attn", *tensor["layers"][1:]]


def _reordered(plan: dict[str, Any], pool: str) -> None:
    del pool
    plan["pools"].reverse()
    plan["tensors"].reverse()


EDITS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "no views": _no_views,
    "view renamed": _view_renamed,
    "view flattened": _view_flattened,
    "layer numbered in 5000 digits": _long_layer_number,
    "pools and tensors reordered": _reordered,
    "pool renamed to mamba_conv0": lambda plan, pool: _renamed_pool(plan, pool, "mamba_conv0"),
    "pool renamed to swa": lambda plan, pool: _renamed_pool(plan, pool, "swa"),
    "pool renamed": lambda plan, pool: _renamed_pool(plan, pool, f"{pool}_other"),
}


def _accepted(plan: dict[str, Any]) -> SGLangPlan | None:
    """The edited plan, when check_plan accepts it (the adapters must then answer for it)."""
    try:
        hp.check_plan(plan)
    except (hp.PlanError, ValidationError):
        return None
    return SGLangPlan.model_validate(plan)


def _refusal(call: Callable[[], object]) -> hp.PlanError | ValidationError | None:
    """What `call` refused with (anything else is raised), or None when it answered."""
    try:
        call()
    except (hp.PlanError, ValidationError) as error:
        return error
    return None


def _adapters_answer_or_refuse(plan: SGLangPlan) -> None:
    for adapter in (sglang_adapter.pool_kwargs, sglang_adapter.report):
        refusal = _refusal(partial(adapter, plan))
        assert refusal is None or isinstance(refusal, hp.PlanError), refusal


def _refused(adapter: Callable[[SGLangPlan], object], edited: dict[str, Any]) -> str | None:
    """`adapter`'s refusal of an edited plan, a PlanError whatever the edit: its own message
    for a plan check_plan accepts (returned), check_plan's for one it refuses (the adapters
    check first; None is returned)."""
    plan = SGLangPlan.model_validate(edited)
    with pytest.raises(hp.PlanError) as caught:
        adapter(plan)
    invariant = _refusal(partial(hp.check_plan, plan))
    if invariant is not None:
        assert str(caught.value) == str(invariant)
        return None
    return str(caught.value)


@pytest.mark.parametrize(("index", "pool", "edit"), [
    (0, "kv", "no views"),
    (0, "kv", "view renamed"),
    (0, "kv", "view flattened"),
    (0, "kv", "pool renamed to mamba_conv0"),
    (2, "swa", "view renamed"),
    (3, "kv", "view flattened"),
    (6, "mamba_temporal", "no views"),
    (2, "swa", "layer numbered in 5000 digits"),
])
def test_pool_kwargs_refuses_a_plan_it_cannot_read(index: int, pool: str, edit: str) -> None:
    """Each edit is one check_plan accepted (at 68ba596); pool_kwargs raised StopIteration,
    IndexError or ValueError on it, and now says what it expected."""
    plan = copy.deepcopy(sglang_plan(index))
    EDITS[edit](plan, pool)
    message = _refused(sglang_adapter.pool_kwargs, plan)
    assert message is None or "expected" in message


def test_report_refuses_a_layer_numbered_past_any_model() -> None:
    plan = copy.deepcopy(sglang_plan(0))
    _long_layer_number(plan, "kv")
    message = _refused(sglang_adapter.report, plan)
    assert message is None or message.startswith(
        "tensors: layer 'model.layers.7777")
    assert message is None or "5000 digits; expected a layer index of at most 18" in message


def test_a_view_missing_is_named_with_what_the_plan_has() -> None:
    plan = copy.deepcopy(sglang_plan(0))
    _view_renamed(plan, "kv")
    message = _refused(sglang_adapter.pool_kwargs, plan)
    assert message in (None, "plan: pool 'kv' has no view 'k_buffer'; expected one, got views "
                             "['renamed', 'v_buffer']")


def test_a_view_of_other_axes_is_named_with_its_shape() -> None:
    plan = copy.deepcopy(sglang_plan(0))
    _view_flattened(plan, "kv")
    message = _refused(sglang_adapter.pool_kwargs, plan)
    assert message is None or re.fullmatch(
        r"plan: view 'k_buffer' of pool 'kv' has shape \[\d+, \d+\]; expected the axes "
        r"\[rows, heads, head_dim\]", message), message


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(index=st.integers(0, len(KINDS) - 1), edit=st.sampled_from(sorted(EDITS)),
       choice=st.integers(0, 20))
def test_the_adapters_answer_or_refuse_any_plan_check_plan_accepts(
    index: int, edit: str, choice: int
) -> None:
    plan = copy.deepcopy(sglang_plan(index))
    pools = [pool["name"] for pool in plan["pools"]]
    EDITS[edit](plan, pools[choice % len(pools)])
    accepted = _accepted(plan)
    if accepted is not None:
        _adapters_answer_or_refuse(accepted)


def test_the_planners_own_plans_still_read() -> None:
    for index in range(len(KINDS)):
        plan = SGLangPlan.model_validate(sglang_plan(index))
        assert sglang_adapter.report(plan)["pools"]
        if plan.deepseek_v4 is None:
            assert "kv" in sglang_adapter.pool_kwargs(plan) or "mamba" in (
                sglang_adapter.pool_kwargs(plan))


# -- one engine's functions given the other engine's plan ------------------------------------------


@pytest.mark.parametrize("adapter", [sglang_adapter.pool_kwargs, sglang_adapter.report])
def test_sglang_functions_refuse_a_vllm_plan(adapter: Callable[[Any], Any]) -> None:
    with pytest.raises(hp.PlanError, match=r"expected an SGLang plan \(SGLangPlan\), got a vLLM "
                       r"plan \(KVCachePlan\)"):
        adapter(vllm_plan())


@pytest.mark.parametrize("function", [
    to_kv_cache_config, to_kv_cache_configs, plan_views,
    lambda plan: tensor_views(plan, 0),
])
def test_vllm_functions_refuse_an_sglang_plan(function: Callable[[Any], Any]) -> None:
    plan = SGLangPlan.model_validate(sglang_plan(0))
    with pytest.raises(hp.PlanError, match=r"expected a vLLM plan \(KVCachePlan\), got an "
                       r"SGLang plan \(SGLangPlan\)"):
        function(plan)


# -- the planners and the SGLang adapter on inputs of the wrong shape ------------------------------


ODD_VALUES: list[Any] = [None, 1, 1.5, True, "x", b"{}", [], {}, {"a": 1}, object()]
MEMORY = {"available_bytes": 2**34}


@cache
def _config() -> Architecture:
    """A model as an architecture: a config.json dict would be read through transformers,
    whose import alone takes seconds."""
    return load_preset("llama-3-8b").architecture


def _entry_calls(value: Any) -> list[tuple[str, Callable[[], object]]]:
    """Every public entry point with `value` in one of its arguments."""
    config = _config()
    return [
        ("plan", lambda: hp.plan(value)),
        ("plan_traced", lambda: plan_traced(value)),
        ("plan_for_engine", lambda: hp.plan_for_engine(value)),
        ("plan_sglang", lambda: plan_sglang(value)),
        ("request_from_server_args config",
         lambda: sglang_adapter.request_from_server_args(value, {}, MEMORY)),
        ("request_from_server_args server_args",
         lambda: sglang_adapter.request_from_server_args(config, value, MEMORY)),
        ("request_from_server_args memory",
         lambda: sglang_adapter.request_from_server_args(config, {}, value)),
        ("request_from_server_args gpu",
         lambda: sglang_adapter.request_from_server_args(config, {}, MEMORY, gpu=value)),
        ("settings_from_server_args", lambda: sglang_adapter.settings_from_server_args(value)),
        ("settings_from_server_args memory",
         lambda: sglang_adapter.settings_from_server_args({"context_length": 8}, value)),
        ("request_from_sglang memory", lambda: sglang_adapter.request_from_sglang(
            types.SimpleNamespace(context_length=8), value, config=config)),
        ("request_from_sglang", lambda: sglang_adapter.request_from_sglang(
            value, MEMORY, config=config)),
        ("settings_from_sglang", lambda: sglang_adapter.settings_from_sglang(value)),
        ("server_args_mapping", lambda: sglang_adapter.server_args_mapping(value)),
        ("sglang_request", lambda: sglang_adapter.sglang_request(value, value)),
        ("pool_kwargs", lambda: sglang_adapter.pool_kwargs(value)),
        ("report", lambda: sglang_adapter.report(value)),
        ("layer_id", lambda: sglang_adapter.layer_id(value, 0)),
        ("request_from_vllm specs", lambda: request_from_vllm(value, None, 1)),
        ("request_from_vllm config", lambda: request_from_vllm({"a": value}, value, 1)),
    ]


CALLS = [
    (name, index) for index, value in enumerate(ODD_VALUES) for name, _ in _entry_calls(None)
    # A string is a path there: reading it is the guarded file reader's (tested with it).
    if not (name == "request_from_server_args config" and isinstance(value, str))
]


@pytest.mark.parametrize(("name", "index"), CALLS)
def test_entry_points_refuse_odd_arguments_cleanly(name: str, index: int) -> None:
    refusal = _refusal(dict(_entry_calls(ODD_VALUES[index]))[name])
    if isinstance(refusal, ValidationError):
        # Only the caller's own request, validated as given, may be malformed.
        assert refusal.title == "PlanRequest", refusal


@pytest.mark.parametrize("text", [
    "", "{", "[]", "1", "[" * 100_000 + "]" * 100_000, '{"top_k": 1' + "0" * 5000 + "}",
    '{"top_k": 2048, "top_k": 4096}', b"\xff",
])
def test_hisparse_config_text_is_refused_in_one_line(text: str | bytes) -> None:
    server_args = types.SimpleNamespace(enable_hisparse=True, hisparse_config=text,
                                        context_length=8)
    for call in (lambda: sglang_adapter.server_args_mapping(server_args),
                 lambda: sglang_adapter.request_from_server_args(
                     _config(), {"hisparse_config": text, "enable_hisparse": True}, MEMORY)):
        with pytest.raises(hp.PlanError, match=r"^hisparse_config[.:]") as caught:
            call()
        assert (caught.value.field or "").split(".")[0] == "hisparse_config"
        assert "\n" not in str(caught.value)


def test_report_for_case_answers_an_error_for_anything() -> None:
    for value in ODD_VALUES:
        answer = sglang_adapter.report_for_case(value)
        assert set(answer) == {"error"}, value


# Near misses of what an entry point takes (issue 28, item 4): one PlanError each, naming what
# was expected and what came, and the right spelling where there is one.

SMALL_REQUEST = GOLDEN / "bf16_small_with_full_attention.request.json"


def _small_request() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SMALL_REQUEST.read_text())
    return loaded


@pytest.mark.parametrize("given", [SMALL_REQUEST, str(SMALL_REQUEST), "plans/mine.json"],
                         ids=["Path", "existing file", "json name"])
def test_load_plan_given_a_path_says_so(given: object) -> None:
    with pytest.raises(hp.PlanError, match=r"load_plan: expected a plan .* got a path .*"
                                           r"read the file first"):
        hp.load_plan(given)  # type: ignore[arg-type]


def test_plan_given_a_path_says_so() -> None:
    with pytest.raises(hp.PlanError, match=r"plan: expected a PlanRequest.* got a path"):
        hp.plan(SMALL_REQUEST)  # type: ignore[arg-type]


def test_plan_takes_a_request_s_json_text() -> None:
    """JSON text is read as its dict is (strictly: a key twice is refused)."""
    text = SMALL_REQUEST.read_text()
    assert hp.plan(text) == hp.plan(_small_request())
    assert hp.plan_for_engine(text.encode()) == hp.plan(_small_request())
    with pytest.raises(hp.PlanError, match="duplicate key"):
        hp.plan('{"model": {}, "model": {}}')


PRESET_WHERE: list[tuple[str, Callable[[Any], Any]]] = [
    ("plan", hp.plan),
    ("plan_for_engine", hp.plan_for_engine),
    ("build_request", lambda preset: __import__("hisparse_plan.presets", fromlist=["x"])
     .build_request(preset)),
    ("config", lambda preset: sglang_adapter.request_from_server_args(
        preset, {}, {"available_bytes": 2**30})),
    ("config", lambda preset: sglang_adapter.request_from_sglang(
        types.SimpleNamespace(), {"available_bytes": 2**30}, config=preset)),
]


@pytest.mark.parametrize(("where", "call"), PRESET_WHERE,
                         ids=["plan", "plan_for_engine", "build_request",
                              "request_from_server_args", "request_from_sglang"])
def test_a_preset_where_its_architecture_goes_is_named(
    where: str, call: Callable[[Any], Any]
) -> None:
    preset = load_preset("deepseek-v3.2")
    with pytest.raises(hp.PlanError, match=(
        rf"{where}: expected .*, got the preset 'deepseek-v3.2' \(Preset\); pass .*"
        r"load_preset\('deepseek-v3.2'\)\.architecture")):
        call(preset)
    # the architecture itself is what they take
    if where == "build_request":
        assert call(preset.architecture) is not None


@pytest.mark.parametrize(("key", "meant"), [
    ("--gpu-mem", "device.available_bytes"),
    ("gpu_memory_utilization", "device.available_bytes"),
    ("max_model_len", "model.max_model_len"),
    ("kv-cache-layout", "device.kv_cache_layout"),
    ("max_num_batched_tokens", "scheduler.max_num_batched_tokens"),
    ("devices", "device"),
])
def test_a_cli_spelling_in_a_request_dict_names_the_field(key: str, meant: str) -> None:
    request = _small_request() | {key: 1}
    for planner in (hp.plan, hp.plan_for_engine):
        with pytest.raises(hp.PlanError, match=(
            rf"'{re.escape(key)}': not a field of a plan request; did you mean "
            rf"{re.escape(meant)}\b")) as caught:
            planner(request)
        assert caught.value.field == key


def test_an_unknown_key_nothing_like_a_field_is_left_to_validation() -> None:
    with pytest.raises(ValidationError, match="zzz_unrelated"):
        hp.plan(_small_request() | {"zzz_unrelated": 1})


@pytest.mark.parametrize(("key", "meant"), [
    ("gpu_memory_utilization", "gpu_mem_bytes"),
    ("gpu_mem", "gpu_mem_bytes"),
    ("tensor_parallel_size", "tp"),
    ("kv_cache_dtype", "kv_dtype"),
    ("max_model_lne", "max_model_len"),
])
def test_settings_given_a_cli_spelling_names_its_own_field(key: str, meant: str) -> None:
    from hisparse_plan.presets import Settings

    settings_cls: Any = Settings  # a keyword it does not take, on purpose
    with pytest.raises(hp.PlanError, match=(
        rf"Settings\.{key}: not a Settings field; did you mean {meant}\b.*expected one of")):
        settings_cls(**{key: 1})


def test_settings_errors_name_settings_fields() -> None:
    from hisparse_plan.presets import Settings

    with pytest.raises(hp.PlanError, match=r"Settings\.gpu_mem_bytes: expected an integer >= 0"
                       ) as caught:
        Settings(gpu_mem_bytes=-1)
    assert "available_bytes" not in str(caught.value)
