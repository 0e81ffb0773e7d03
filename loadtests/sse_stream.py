"""A minimal reader of an OpenAI streaming response, for the load generator.

It records only what the measures need: the arrival time of every chunk that carries content (a
non-empty `delta.content` or `delta.reasoning_content` in chat, `text` in completions; the first chat
chunk's empty role delta is not content), the usage chunk's token counts, an error event, and
`[DONE]`. Both `\\n\\n` and `\\r\\n\\r\\n` event separators are accepted; `data:` lines are read, other
SSE fields (comments, `event:`, `id:`) are skipped.

One `SseStream` per response, fed from one task: `feed(bytes, now)` per network read (events
completed by that read all get time `now`), then `finish(now)`. This is the generator's hot path: one
JSON decode per event and a few dict lookups, nothing else.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson


class SseStream:
    """What one response stream has said so far.

    `chunk_times`: arrival of each content chunk (seconds, the `now` given to `feed`);
    `prompt_tokens`, `completion_tokens`, `cached_tokens`: from the usage chunk (None until seen;
    cached from `prompt_tokens_details.cached_tokens`); `done`: `[DONE]` seen; `error`: None, or
    `"stream-error: ..."` for an error event or an undecodable chunk, or `"incomplete: ..."` when the
    stream ended without `[DONE]` (set by `finish`).
    """

    __slots__ = (
        "_buf",
        "cached_tokens",
        "chunk_times",
        "completion_tokens",
        "done",
        "error",
        "prompt_tokens",
    )

    def __init__(self) -> None:
        self._buf = b""
        self.chunk_times: list[float] = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.error: str | None = None
        self.done = False

    async def consume(self, content: aiohttp.StreamReader) -> None:
        """Read a response body to its end, timing each read with `time.perf_counter()`.

        It reads on after `[DONE]` or an error: a body read to its end leaves the connection reusable,
        one left unread is closed on release."""
        perf_counter = time.perf_counter
        async for data in content.iter_any():
            self.feed(data, perf_counter())
        self.finish(perf_counter())

    def whole(self, body: bytes) -> None:
        """Read a non-streaming answer (one JSON body, `"stream": false`): its usage, or an error.
        It has no chunk times (no first token to time); it counts as done."""
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            self.error = f"stream-error: malformed answer {body[:80]!r}"
            return
        if isinstance(answer, dict) and "error" in answer:
            self.error = f"stream-error: {error_message(answer['error'])}"
            return
        self.done = True
        if isinstance(answer, dict) and answer.get("usage"):
            self._chunk({"usage": answer["usage"]}, 0.0)

    def feed(self, data: bytes, now: float) -> None:
        """Take the next bytes of the body, received at `now`."""
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        while (cut := buf.find(b"\n\n")) != -1:
            event, buf = buf[:cut], buf[cut + 2 :]
            if not self.done and self.error is None:
                self._event(event, now)
        self._buf = buf

    def finish(self, now: float) -> None:
        """The body has ended: read a last unterminated event, and flag a stream without `[DONE]`."""
        if self._buf.strip() and not self.done and self.error is None:
            self._event(self._buf, now)
        self._buf = b""
        if not self.done and self.error is None:
            self.error = "incomplete: the stream ended without [DONE]"

    def _event(self, event: bytes, now: float) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return
            try:
                self._chunk(orjson.loads(payload), now)
            except (orjson.JSONDecodeError, AttributeError, TypeError):
                self.error = f"stream-error: malformed chunk {payload[:80]!r}"
                return
            if self.error is not None:
                return

    def _chunk(self, chunk: Any, now: float) -> None:
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            self.error = f"stream-error: {error_message(chunk['error'])}"
            return
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta is None:
                text = choice.get("text")
            else:
                text = delta.get("content") or delta.get("reasoning_content")
            if text:
                self.chunk_times.append(now)
                break
        usage = chunk.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details")
            if details:
                self.cached_tokens = details.get("cached_tokens")


def error_message(error: Any) -> str:
    """The `message` of an OpenAI error object (or the value itself), at most 200 characters."""
    if isinstance(error, dict):
        return str(error.get("message") or error)[:200]
    return str(error)[:200]
