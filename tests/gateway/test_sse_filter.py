"""The SSE framer relays bytes untouched, strips only the usage chunk, and copes with any split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse_filter import SseFilter
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES


def load(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def run(filt: SseFilter, pieces: list[bytes]) -> bytes:
    out = b"".join(filt.feed(p) for p in pieces)
    return out + filt.flush()


@pytest.mark.parametrize("name", ["chat_stream.sse", "completion_stream.sse"])
def test_keeps_everything_when_client_asked_for_usage(name: str) -> None:
    raw = load(name)
    f = SseFilter(strip_usage=False)
    assert run(f, [raw]) == raw
    assert f.usage is not None and f.usage.completion_tokens > 0 and f.done


@pytest.mark.parametrize("name", ["chat_stream.sse", "completion_stream.sse"])
def test_strips_only_the_usage_chunk(name: str) -> None:
    raw = load(name)
    f = SseFilter(strip_usage=True)
    out = run(f, [raw])
    events = [e for e in raw.split(b"\n\n") if e]
    usage_events = [e for e in events if b'"usage":{' in e]
    assert len(usage_events) == 1
    assert out == b"".join(e + b"\n\n" for e in events if e not in usage_events)
    assert f.usage is not None and f.usage.prompt_tokens > 0
    assert out.endswith(b"data: [DONE]\n\n")


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=30), strip=st.booleans())
def test_any_split_of_the_stream_gives_the_same_bytes(cuts: list[int], strip: bool) -> None:
    raw = load("chat_stream.sse")
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces, prev = [], 0
    for p in points:
        pieces.append(raw[prev:p])
        prev = p
    pieces.append(raw[prev:])
    whole = SseFilter(strip_usage=strip)
    expected = run(whole, [raw])
    split = SseFilter(strip_usage=strip)
    assert run(split, pieces) == expected
    assert split.usage == whole.usage


def test_error_event_is_noticed_and_passed_through() -> None:
    f = SseFilter(strip_usage=True)
    err = b'data: {"error": {"message": "boom", "type": "x", "code": 500}}\n\ndata: [DONE]\n\n'
    assert f.feed(err) == err
    assert f.error and f.done


def test_malformed_usage_chunk_is_forwarded_not_crashing() -> None:
    f = SseFilter(strip_usage=True)
    bad = b'data: {"choices":[],"usage":{"prompt_tokens":"x"}}\n\n'
    assert f.feed(bad) == bad
    assert f.usage is None
