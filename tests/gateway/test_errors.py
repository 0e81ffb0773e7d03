"""gateway/errors: kvgate's own errors survive the ways Python code handles exceptions in flight."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import orjson
import pytest

from gateway.errors import GatewayError


@contextlib.contextmanager
def passes_through() -> Iterator[None]:
    yield  # contextlib re-raises what the block raised, setting its __traceback__


def test_an_error_crosses_a_generator_context_manager_and_takes_notes() -> None:
    with pytest.raises(GatewayError) as info, passes_through():
        raise GatewayError(503, "fleet overloaded", headers=((b"retry-after", b"2"),))
    err = info.value
    err.add_note("seen by a middleware")
    assert err.status == 503 and err.__notes__ == ["seen by a middleware"]


def test_replace_makes_a_variant_and_equality_is_identity() -> None:
    a = GatewayError(429, "slow down", code="rate_limit_exceeded")
    b = replace(a, headers=((b"retry-after", b"1"),))
    assert b.status == 429 and b.headers and not a.headers
    assert a != GatewayError(429, "slow down", code="rate_limit_exceeded") and a == a
    assert len({a, b}) == 2  # hashable, as exceptions are


def test_body_is_openai_shaped() -> None:
    body = orjson.loads(GatewayError(404, "no such model", param="model").body())
    assert body == {
        "error": {"message": "no such model", "type": "not_found_error", "param": "model", "code": 404}
    }
