"""Chunks built from byte templates are valid JSON with exactly the shape of vLLM 0.32's captures."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from simulator.server.sse import DONE, ChunkTemplates, PieceCache, error_chunk
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES


def events(raw: bytes) -> list[bytes]:
    out = []
    for block in raw.split(b"\n\n"):
        if block:
            assert block.startswith(b"data: ")
            out.append(block[len(b"data: "):])
    return out


def shape(value: Any) -> Any:
    """The structure of a JSON value: dict keys (recursively) and types, not the values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def build_stream(t: ChunkTemplates, pieces: list[str], finish: str, usage: tuple[int, int, int]) -> bytes:
    out = [t.role] if t.role is not None else []
    for i, piece in enumerate(pieces):
        tail = t.last_tail(finish, None) if i == len(pieces) - 1 else t.tail
        out.append(t.head + orjson.dumps(piece) + tail)
    out.append(t.usage(*usage))
    out.append(DONE)
    return b"".join(out)


@pytest.mark.parametrize(("kind", "fixture"),
                         [("chat", "chat_stream.sse"), ("completion", "completion_stream.sse")])
def test_stream_matches_the_fixture_shape(kind: str, fixture: str) -> None:
    theirs = events((FIXTURES / fixture).read_bytes())
    t = ChunkTemplates(kind, "x-1", 1796208837, "tiny-llama")  # type: ignore[arg-type]
    ours = events(build_stream(t, ["a", 'q"uo\\te\n', "é"], "length", (25, 3, 16)))
    assert ours[-1] == theirs[-1] == b"[DONE]"
    # Same number of leading fixed chunks (role chunk), same shape of each kind of chunk.
    parsed_theirs = [orjson.loads(e) for e in theirs[:-1]]
    parsed_ours = [orjson.loads(e) for e in ours[:-1]]
    assert shape(parsed_ours[0]) == shape(parsed_theirs[0])
    assert shape(parsed_ours[1]) == shape(parsed_theirs[1])
    assert shape(parsed_ours[-2]) == shape(parsed_theirs[-2])  # the chunk that carries finish_reason
    usage_ours, usage_theirs = parsed_ours[-1], parsed_theirs[-1]
    assert usage_ours["choices"] == usage_theirs["choices"] == []
    assert set(usage_ours) == set(usage_theirs)
    assert usage_ours["usage"] == {"prompt_tokens": 25, "completion_tokens": 3, "total_tokens": 28,
                                   "prompt_tokens_details": {"cached_tokens": 16}}


def test_text_round_trips_through_the_template() -> None:
    t = ChunkTemplates("chat", "chatcmpl-1", 1, 'mo"del')
    chunk = orjson.loads(events(t.head + orjson.dumps('q"uo\\te\n') + t.tail)[0])
    assert chunk["choices"][0]["delta"]["content"] == 'q"uo\\te\n'
    assert chunk["model"] == 'mo"del'
    assert chunk["id"] == "chatcmpl-1"


def test_stop_reason_is_carried_on_the_last_chunk() -> None:
    t = ChunkTemplates("completion", "cmpl-1", 1, "m")
    chunk = orjson.loads(events(t.head + b'"x"' + t.last_tail("stop", " and"))[0])
    assert (chunk["choices"][0]["finish_reason"], chunk["choices"][0]["stop_reason"]) == ("stop", " and")


def test_error_chunk_and_piece_cache() -> None:
    assert error_chunk(b'{"error":{}}') == b'data: {"error":{}}\n\n'
    calls: list[int] = []

    def decode(token_id: int) -> str:
        calls.append(token_id)
        return f"<{token_id}>"

    cache = PieceCache(decode)
    assert cache.json(7) == b'"<7>"'
    assert cache.json(7) == b'"<7>"'
    assert cache.text(7) == "<7>"
    assert calls == [7]
