"""Server-sent-event chunks of vLLM's streams, built from byte templates made once per request.

A token chunk is `head + json(piece) + tail`: no dict building and no JSON dump per token. The JSON of each
token's text is cached per token id by `PieceCache`, so a piece is escaped once per replica, not per chunk.
Shapes follow vLLM 0.32's captures (`chat.completion.chunk` with a first role delta; `text_completion`).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from simulator.server.openai_schema import Kind

DONE = b"data: [DONE]\n\n"
SYSTEM_FINGERPRINT = "vllm-0.32.0-kvgate-sim"

_CACHE_LIMIT = 1 << 16


class PieceCache:
    """Token id -> its text and the JSON string literal of that text. Owned by one replica, one thread."""

    def __init__(self, decode_token: Callable[[int], str]) -> None:
        self._decode = decode_token
        self._json: dict[int, bytes] = {}
        self._text: dict[int, str] = {}

    def json(self, token_id: int) -> bytes:
        piece = self._json.get(token_id)
        if piece is None:
            if len(self._json) >= _CACHE_LIMIT:
                self._json.clear()
            piece = self._json[token_id] = orjson.dumps(self.text(token_id))
        return piece

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            if len(self._text) >= _CACHE_LIMIT:
                self._text.clear()
            text = self._text[token_id] = self._decode(token_id)
        return text


class ChunkTemplates:
    """The byte pieces of one request's stream. `head + json_text + tail` is one token chunk."""

    __slots__ = ("_kind", "_prefix", "head", "role", "tail")

    def __init__(self, kind: Kind, response_id: str, created: int, model: str) -> None:
        self._kind = kind
        obj = b"chat.completion.chunk" if kind == "chat" else b"text_completion"
        self._prefix = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,' % (
            response_id.encode(), obj, created, orjson.dumps(model))
        if kind == "chat":
            self.head = self._prefix + b'"choices":[{"index":0,"delta":{"content":'
            self.tail = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            self.role: bytes | None = self._prefix + (
                b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n')
        else:
            self.head = self._prefix + b'"choices":[{"index":0,"text":'
            self.tail = (b',"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
                         b'"token_ids":null}]}\n\n')
            self.role = None

    def last_tail(self, finish_reason: str, stop_reason: str | None) -> bytes:
        """The tail of the final token chunk, which carries `finish_reason` (and vLLM's `stop_reason`)."""
        stop = orjson.dumps(stop_reason)
        if self._kind == "chat":
            return b'},"logprobs":null,"finish_reason":"%s","stop_reason":%s,"token_ids":null}]}\n\n' % (
                finish_reason.encode(), stop)
        return (b',"logprobs":null,"finish_reason":"%s","stop_reason":%s,"prompt_token_ids":null,'
                b'"token_ids":null}]}\n\n' % (finish_reason.encode(), stop))

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        """The `stream_options.include_usage` chunk: empty `choices` and a `usage` object."""
        return self._prefix + b'"choices":[],"usage":%s,"system_fingerprint":"%s"}\n\n' % (
            usage_json(prompt_tokens, completion_tokens, cached_tokens), SYSTEM_FINGERPRINT.encode())


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
    return (b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,'
            b'"prompt_tokens_details":{"cached_tokens":%d}}' % (
                prompt_tokens, prompt_tokens + completion_tokens, completion_tokens, cached_tokens))


def error_chunk(error_body: bytes) -> bytes:
    """An error after the stream began: `data: {"error": ...}` (followed by `[DONE]`)."""
    return b"data: " + error_body + b"\n\n"
