"""Strict request JSON: duplicate keys refused with their path, errors quoting short excerpts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from hisparse_plan.errors import PlanError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.json_input import EXCERPT_CHARS, cut, excerpt, load_request_json
from support.golden import GOLDEN

LIMIT = EXCERPT_CHARS + 40
"""What an excerpt may take, its "characters cut" note included."""


def refusal(text: str | bytes) -> PlanError:
    with pytest.raises(PlanError) as caught:
        load_request_json(text)
    return caught.value


def test_a_request_reads_as_json_does() -> None:
    raw = (GOLDEN / "deepseek_v32_fp8.request.json").read_bytes()
    assert load_request_json(raw) == json.loads(raw)
    assert load_request_json(raw.decode()) == json.loads(raw)
    assert load_request_json(raw.decode().encode("utf-16")) == json.loads(raw)


@pytest.mark.parametrize(("text", "field", "inside"), [
    ('{"a": 1, "a": 2}', "a", "the top-level object"),
    ('{"layers": {"m.0.attn": {"kind": "mla", "kind": "mla"}}}',
     "layers['m.0.attn'].kind", "layers['m.0.attn']"),
    ('{"x": [{}, {"y": {"z": 1, "z": 1}}]}', "x[1].y.z", "x[1].y"),
    ('{"layers": {"m.0": {}, "m.0": {}}}', "layers['m.0']", "layers"),
])
def test_duplicate_keys_are_refused_with_their_path(text: str, field: str, inside: str) -> None:
    error = refusal(text)
    assert error.field == field
    assert str(error).startswith(f"{field}: duplicate key ")
    assert f" in {inside};" in str(error)


def test_the_first_duplicate_in_document_order_is_named() -> None:
    error = refusal('{"a": {"b": 1, "b": 2}, "c": {"d": 1, "d": 2}}')
    assert error.field == "a.b"


@pytest.mark.parametrize(("text", "fragment"), [
    ("{", "Invalid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ("[1, 2]", "request: expected a JSON object, got list [1, 2]"),
    ("null", "request: expected a JSON object, got NoneType None"),
    (b"\xff\xfe\x00", "Invalid JSON"),
    ("[" * 100_000, "nested too deeply"),
    ('{"n": ' + "1" * 10_000 + "}", "Invalid JSON"),
])
def test_malformed_text_is_a_plan_error(text: str | bytes, fragment: str) -> None:
    error = refusal(text)
    assert fragment in str(error)
    assert error.field == "request"
    assert len(str(error)) < 2 * LIMIT


@pytest.mark.parametrize("text", [
    '{"' + "k" * 1_000_000 + '": 1, "' + "k" * 1_000_000 + '": 2}',
    '["' + "v" * 1_000_000 + '"]',
    '{"a": "' + "v" * 1_000_000 + '"' + " " * 1000,
])
def test_errors_quote_only_an_excerpt(text: str) -> None:
    assert len(str(refusal(text))) < 3 * LIMIT


@given(st.text(max_size=2000), st.integers(min_value=20, max_value=400))
def test_cut_keeps_the_ends_and_bounds_the_length(text: str, limit: int) -> None:
    shown = cut(text, limit)
    if len(text) <= limit:
        assert shown == text
    else:
        assert len(shown) <= limit + 40
        assert "characters cut" in shown
        head = shown.split("...<")[0]
        assert text.startswith(head)


@given(st.recursive(st.integers() | st.text(), lambda inner: st.lists(inner, max_size=4)))
def test_excerpt_is_repr_when_short(value: Any) -> None:
    shown = excerpt(value)
    assert shown == repr(value) or len(shown) <= LIMIT


# PlanRequest.model_validate_json: plain parsing where the text proves no key is repeated.

def _request_text(**layer_extra: object) -> str:
    raw = (GOLDEN / "deepseek_v32_fp8.request.json").read_text()
    data = json.loads(raw)
    first = next(iter(data["layers"]))
    data["layers"][first].update(layer_extra)
    return json.dumps(data, indent=1)


def test_a_request_validates_from_json_as_from_its_data() -> None:
    text = _request_text()
    assert PlanRequest.model_validate_json(text) == PlanRequest.model_validate(json.loads(text))
    encoded = text.encode("utf-16")
    assert PlanRequest.model_validate_json(encoded) == PlanRequest.model_validate_json(text)
    assert PlanRequest.model_validate_json(bytearray(encoded)) == PlanRequest.model_validate_json(
        text)


@pytest.mark.parametrize("where", ["layer", "top", "nested"])
@pytest.mark.parametrize("name_has_colon", [False, True])
def test_a_duplicate_is_refused_even_where_the_request_would_validate(
    where: str, name_has_colon: bool
) -> None:
    # The last copy is valid, so plain parsing and validation alone would accept the text.
    text = _request_text()
    if name_has_colon:  # a ':' inside a string: the count proves nothing, the strict read runs
        text = text.replace("model.layers.0.self_attn.attn", "model:layers.0.self_attn.attn")
    if where == "layer":
        text = text.replace('"block_size": 64,', '"block_size": 32, "block_size": 64,', 1)
        field = "block_size"
    elif where == "top":
        text = text.replace('"model": {', '"model": {"max_model_len": 1}, "model": {', 1)
        field = "model"
    else:
        text = text.replace('"max_model_len":', '"max_model_len": 3, "max_model_len":', 1)
        field = "model.max_model_len"
    with pytest.raises(PlanError) as caught:
        PlanRequest.model_validate_json(text)
    assert caught.value.field is not None
    assert caught.value.field.endswith(field)
    assert "duplicate key" in str(caught.value)


def test_a_duplicate_is_named_before_the_validation_error_it_caused() -> None:
    text = _request_text().replace('"block_size": 64,', '"block_size": 64, "block_size": 0,', 1)
    with pytest.raises(PlanError, match="duplicate key 'block_size'"):
        PlanRequest.model_validate_json(text)


def test_colons_inside_strings_do_not_refuse_a_sound_request() -> None:
    text = _request_text(cache_dtype="fp8:ds:mla")
    assert PlanRequest.model_validate_json(text).layers[
        "model.layers.0.self_attn.attn"].cache_dtype == "fp8:ds:mla"  # type: ignore[union-attr]


def test_validation_errors_still_come_out_as_validation_errors() -> None:
    with pytest.raises(ValidationError):
        PlanRequest.model_validate_json(_request_text(block_size=0))
    with pytest.raises(PlanError, match="Invalid JSON"):
        PlanRequest.model_validate_json(_request_text()[:-3])
    with pytest.raises(PlanError, match="expected a JSON object"):
        PlanRequest.model_validate_json("[1]")


@pytest.mark.parametrize("edit", [
    # pydantic's parser refuses a lone surrogate that Python's json reads: the strict reading
    # takes over and the request validates as json reads it
    ('"model.layers.0.self_attn.attn"', '"model.layers.0.self_attn.attn\\ud800"'),
    ('"max_model_len": 163840', '"max_model_len": 1' + "0" * 4301),  # beyond int's digit limit
    ('"max_model_len": 163840', '"max_model_len": 163840,'),  # a trailing comma
    ('"layers": {', '\ufeff"layers": {'),
])
def test_the_fast_parser_never_decides_what_json_would_decide_otherwise(
    edit: tuple[str, str],
) -> None:
    text = _request_text().replace(*edit, 1)
    assert text != _request_text()
    try:
        expected: object = PlanRequest.model_validate(load_request_json(text))
    except (PlanError, ValidationError) as error:
        expected = (type(error), str(error))
    try:
        got: object = PlanRequest.model_validate_json(text)
    except (PlanError, ValidationError) as error:
        got = (type(error), str(error))
    assert got == expected
