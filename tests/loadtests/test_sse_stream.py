"""The stream reader on real vLLM captures and on hand-made edge cases, fed in pieces."""

from __future__ import annotations

import pytest

from loadtests.sse_stream import SseStream, error_message
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = str(VLLM_FIXTURES)


def read(name: str) -> bytes:
    with open(f"{FIXTURES}/{name}", "rb") as f:
        return f.read()


def feed_in_pieces(data: bytes, size: int) -> SseStream:
    """Feed `data` `size` bytes at a time; read i happens at time i."""
    s = SseStream()
    for i in range(0, len(data), size):
        s.feed(data[i : i + size], float(i // size))
    s.finish(float(len(data) // size + 1))
    return s


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_real_chat_stream(size: int) -> None:
    s = feed_in_pieces(read("chat_stream.sse"), size)
    assert s.done and s.error is None
    assert len(s.chunk_times) == 16  # 16 content chunks; the role chunk's "" is not content
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (25, 16, None)
    assert s.chunk_times == sorted(s.chunk_times)


def test_real_completion_stream() -> None:
    s = feed_in_pieces(read("completion_stream.sse"), 50)
    assert s.done and s.error is None and len(s.chunk_times) == s.completion_tokens


def test_whole_body_in_one_read_shares_one_timestamp() -> None:
    s = SseStream()
    s.feed(read("chat_stream.sse"), 3.0)
    s.finish(4.0)
    assert s.chunk_times == [3.0] * 16


def test_first_content_time_skips_the_role_chunk() -> None:
    s = SseStream()
    s.feed(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n', 1.0)
    s.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n', 2.0)
    s.feed(b"data: [DONE]\n\n", 3.0)
    s.finish(3.0)
    assert s.chunk_times == [2.0] and s.done


def test_reasoning_content_counts_as_content() -> None:
    s = SseStream()
    s.feed(b'data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}\n\ndata: [DONE]\n\n', 1.0)
    s.finish(1.0)
    assert s.chunk_times == [1.0]


def test_usage_with_cached_tokens_and_crlf_framing() -> None:
    s = SseStream()
    body = (
        b'data: {"choices":[{"text":"a"}]}\r\n\r\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,'
        b'"prompt_tokens_details":{"cached_tokens":32}}}\r\n\r\ndata: [DONE]\r\n\r\n'
    )
    for i in range(0, len(body), 5):  # a \r\n split across reads included
        s.feed(body[i : i + 5], 1.0)
    s.finish(2.0)
    assert s.done and (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (40, 1, 32)


def test_comments_and_other_fields_are_skipped() -> None:
    s = SseStream()
    s.feed(
        b': keep-alive\n\nevent: message\nid: 3\ndata: {"choices":[{"text":"x"}]}\n\ndata: [DONE]\n\n', 1.0
    )
    s.finish(1.0)
    assert s.chunk_times == [1.0] and s.done and s.error is None


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            b'data: {"choices":[{"text":"x"}]}\n\n'
            b'data: {"error":{"message":"boom","code":500}}\n\ndata: [DONE]\n\n',
            "stream-error: boom",
        ),
        (b'data: {"choices":[{"text":"x"}]}\n\n', "incomplete: the stream ended without [DONE]"),
        (b"data: {not json\n\n", "stream-error: malformed chunk b'{not json'"),
        (b'data: {"choices":[17]}\n\n', "stream-error: malformed chunk b'{\"choices\":[17]}'"),
        (b"", "incomplete: the stream ended without [DONE]"),
    ],
)
def test_errors(body: bytes, error: str) -> None:
    s = SseStream()
    s.feed(body, 1.0)
    s.finish(2.0)
    assert s.error == error


def test_nothing_after_done_or_error_is_read() -> None:
    s = SseStream()
    s.feed(b'data: {"error":"bad"}\n\ndata: {"choices":[{"text":"late"}]}\n\n', 1.0)
    s.finish(1.0)
    assert s.error == "stream-error: bad" and s.chunk_times == []


def test_last_event_without_blank_line_is_read_at_the_end() -> None:
    s = SseStream()
    s.feed(b'data: {"choices":[{"text":"x"}]}\n\ndata: [DONE]', 1.0)
    s.finish(2.0)
    assert s.done and s.error is None


def test_error_message() -> None:
    assert error_message({"message": "m", "code": 400}) == "m"
    assert error_message("plain") == "plain"
    assert len(error_message("x" * 1000)) == 200


def test_a_whole_answer_gives_its_usage_and_no_chunk_times() -> None:
    s = SseStream()
    usage = b'"usage": {"prompt_tokens": 9, "completion_tokens": 4, '
    usage += b'"prompt_tokens_details": {"cached_tokens": 3}}'
    s.whole(b'{"choices": [{"message": {"content": "hi there"}}], ' + usage + b"}")
    assert s.done and s.error is None and s.chunk_times == []
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (9, 4, 3)
    bad = SseStream()
    bad.whole(b"<html>")
    assert bad.error is not None and bad.error.startswith("stream-error: malformed") and not bad.done
    err = SseStream()
    err.whole(b'{"error": {"message": "boom"}}')
    assert err.error == "stream-error: boom"
