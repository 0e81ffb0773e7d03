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
    events, partial = filt.flush()
    return out + events + partial


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


# -- framings other than LF: CRLF and lone CR line ends are legal SSE ---------------------------------

FRAMINGS = (b"\n\n", b"\r\n\r\n", b"\r\r")


def reframe(raw: bytes, seps: list[bytes]) -> bytes:
    """`raw`'s events (vLLM writes each on one `data:` line) framed by seps[i % len(seps)]."""
    events = [e for e in raw.split(b"\n\n") if e]
    return b"".join(e + seps[i % len(seps)] for i, e in enumerate(events))


def without_usage(stream: bytes) -> bytes:
    """`stream` minus its one usage-only event, whatever its framing."""
    start = stream.rfind(b"data: ", 0, stream.index(b'"choices":[]'))
    end = stream.index(b"data: ", start + 1)
    assert start >= 0 and b'"usage":{' in stream[start:end]
    return stream[:start] + stream[end:]


def boundaries(stream: bytes) -> set[int]:
    """Where events end in a whole stream, by the spec's line rules: a line ends at CRLF, LF or CR,
    and an empty line ends an event."""
    out: set[int] = set()
    i = line_start = 0
    while i < len(stream):
        if stream[i] in b"\r\n":
            end = i + 2 if stream[i : i + 2] == b"\r\n" else i + 1
            if i == line_start:
                out.add(end)
            i = line_start = end
        else:
            i += 1
    return out


def split_at(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces, prev = [], 0
    for p in points:
        pieces.append(raw[prev:p])
        prev = p
    pieces.append(raw[prev:])
    return pieces


@pytest.mark.parametrize("sep", FRAMINGS[1:], ids=["CRLF", "CR"])
@pytest.mark.parametrize("name", ["chat_stream.sse", "completion_stream.sse"])
def test_crlf_and_cr_framed_streams_pass_through_with_their_usage(name: str, sep: bytes) -> None:
    lf = load(name)
    raw = reframe(lf, [sep])
    reference = SseFilter(strip_usage=False)
    run(reference, [lf])
    f = SseFilter(strip_usage=False)
    first = f.feed(raw)
    assert first  # framed as it arrives, not buffered to the end
    assert first + b"".join(f.flush()) == raw
    assert f.usage == reference.usage and f.done and f.events == reference.events and not f.error
    stripped = SseFilter(strip_usage=True)
    assert run(stripped, [raw]) == without_usage(raw)
    assert stripped.usage == reference.usage and stripped.done


@settings(max_examples=300, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=40),
    seps=st.lists(st.sampled_from(FRAMINGS), min_size=1, max_size=4),
    strip=st.booleans(),
)
def test_any_framing_and_any_split_give_the_same_bytes_usage_and_events(
    cuts: list[int], seps: list[bytes], strip: bool
) -> None:
    lf = load("chat_stream.sse")
    raw = reframe(lf, seps)
    reference = SseFilter(strip_usage=False)
    run(reference, [lf])
    whole = SseFilter(strip_usage=strip)
    expected = run(whole, [raw])
    assert expected == (without_usage(raw) if strip else raw)
    split = SseFilter(strip_usage=strip)
    assert run(split, split_at(raw, cuts)) == expected
    for f in (whole, split):
        assert f.usage == reference.usage and f.done and f.events == whole.events and not f.error


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from([b"data: x", b"a", b"\r", b"\n", b"\r\n"]), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_only_whole_events_go_out_whatever_the_line_ends(parts: list[bytes], cuts: list[int]) -> None:
    """Every byte comes out once, and each read's output ends where an event of the whole stream ends:
    a CR at the end of a read waits for the next byte, which may make it a CRLF."""
    raw = b"".join(parts)
    ends = boundaries(raw) | {0}
    f = SseFilter(strip_usage=True)
    sent = 0
    for piece in split_at(raw, cuts):
        sent += len(f.feed(piece))
        assert sent in ends, (raw, sent)
    events, partial = f.flush()
    assert sent + len(events) in ends
    assert sent + len(events) + len(partial) == len(raw)


def test_error_event_in_a_crlf_stream_is_noticed() -> None:
    f = SseFilter(strip_usage=True)
    err = b'data: {"error": {"message": "boom", "type": "x", "code": 500}}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert f.feed(err) == err
    assert f.error and f.done
