"""gateway/fleet/models_parse.py: the real /v1/models capture, bad bodies, fuzz."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fleet.models_parse import ModelsParseError, ServedModels, parse_models
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES


def test_real_capture_with_two_adapters() -> None:
    served = parse_models((FIXTURES / "models_with_adapters.json").read_bytes())
    assert served.base_models == ("tiny-llama",)
    assert dict(served.adapters) == {"lora-a": "tiny-llama", "lora-b": "tiny-llama"}


def test_no_adapters_and_repeated_ids() -> None:
    body = orjson.dumps({"object": "list", "data": [
        {"id": "m", "parent": None}, {"id": "m"}, {"id": "a", "parent": "m"}, {"id": "a", "parent": "x"},
    ]})
    served = parse_models(body)
    assert served.base_models == ("m",)
    assert dict(served.adapters) == {"a": "m"}  # the first listing of a repeated id stands


def test_equal_bodies_give_equal_values() -> None:
    body = (FIXTURES / "models_with_adapters.json").read_bytes()
    assert parse_models(body) == parse_models(body)
    assert parse_models(b'{"data": []}') == ServedModels()


BAD = {
    "not json": b"<html>",
    "invalid utf-8": b'{"data": [{"id": "\xff"}]}',
    "a list": b"[]",
    "no data": b'{"object": "list"}',
    "data not a list": b'{"data": {"id": "m"}}',
    "entry not an object": b'{"data": ["m"]}',
    "id missing": b'{"data": [{"object": "model"}]}',
    "id empty": b'{"data": [{"id": ""}]}',
    "id not a string": b'{"data": [{"id": 7}]}',
    "parent not a string": b'{"data": [{"id": "a", "parent": 3}]}',
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_bad_bodies(body: bytes) -> None:
    with pytest.raises(ModelsParseError):
        parse_models(body)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["id", "parent", "data", "object"]), inner, max_size=4),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=64), _JSON.map(lambda doc: json.dumps(doc).encode())))
def test_fuzz(body: bytes) -> None:
    try:
        served = parse_models(body)
    except ModelsParseError:
        return
    assert all(isinstance(m, str) and m for m in served.base_models)
    assert all(isinstance(a, str) and isinstance(p, str) for a, p in served.adapters.items())
