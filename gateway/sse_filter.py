"""Frame an upstream SSE stream into whole events and pull out the usage chunk, without re-encoding.

The gateway always asks the replica for `stream_options.include_usage`, because settling a tenant's
tokens needs the real usage. When the client did not ask for it, the usage-only chunk
(`"choices": []` + `usage`) is removed from what the client sees. Every other byte passes through
as the replica wrote it.

Events end at a blank line, and SSE lets a line end in LF, CRLF or a lone CR (mixed, even): `\n\n`,
`\r\n\r\n` and `\r\r` all end an event. vLLM writes `\n\n`, so that is the fast path: a read that
ends in `\n\n` (the common case) costs an `endswith`, a few membership tests and no copy; one that
does not costs an `rfind` more and a copy of the tail held back. Only when a CR follows the last
`\n\n` are CR-framed boundaries looked for. Only a read that carries the usage chunk is split into
events and parsed as JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

_USAGE_MARKS = (b'"usage":{', b'"usage": {')
_ERROR_MARKS = (b'data: {"error"', b'data: {"object":"error"', b'data: {"object": "error"')
# A line end (CRLF, LF or CR) that starts a line, i.e. an empty line: the end of an event. A CR
# followed by LF is one line end, so an LF right after a CR does not start a line.
_BLANK_LINE = re.compile(rb"(?:^|(?<=\n)|(?<=\r)(?!\n))(?:\r\n|\r|\n)")


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def usage_from(obj: object) -> Usage | None:
    """`usage` of a parsed response/chunk object, or None when absent or malformed."""
    if not isinstance(obj, dict):
        return None
    u = obj.get("usage")
    if not isinstance(u, dict):
        return None
    pt, ct = u.get("prompt_tokens"), u.get("completion_tokens")
    if not isinstance(pt, int) or not isinstance(ct, int):
        return None
    cached = 0
    details = u.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        cached = details["cached_tokens"]
    return Usage(pt, ct, cached)


class SseFilter:
    """Stateful framer for one stream. Not shared between streams; not thread-safe.

    `feed(data)` returns the bytes to forward now (whole events only; a partial event waits for its
    end). `events` counts forwarded `data:` events, which for vLLM is one per generated token after
    the role chunk: it estimates output tokens for a stream that never sent its usage.
    """

    __slots__ = ("_pending", "done", "error", "events", "strip_usage", "usage")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self._pending = b""
        self.usage: Usage | None = None
        self.error = False
        self.done = False
        self.events = 0

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        if buf.endswith(b"\n\n"):  # the common case: the read ends where an event does
            out, self._pending = buf, b""
        else:
            end = buf.rfind(b"\n\n") + 2
            if end == 1:
                end = 0
            if buf.find(b"\r", end) >= 0:  # CR line ends after the last LF boundary: slower framing
                end = _last_event_end(buf, end, final=False)
            if end == 0:
                self._pending = buf
                return b""
            out, self._pending = buf[:end], buf[end:]
        return self._inspect(out)

    def flush(self) -> tuple[bytes, bytes]:
        """At the end of the stream: (the whole events still held back, inspected like `feed`'s
        output; whatever partial event is left after them, untouched). Events are held back only when
        their blank line ends in CR at the end of a read: the next byte could have made it CRLF."""
        rest, self._pending = self._pending, b""
        end = _last_event_end(rest, 0, final=True)
        if end == 0:
            return b"", rest
        return self._inspect(rest[:end]), rest[end:]

    def _inspect(self, out: bytes) -> bytes:
        """`out` (whole events) with the usage chunk taken out if asked; notes usage, error, [DONE]."""
        if _USAGE_MARKS[0] in out or _USAGE_MARKS[1] in out:
            out = self._take_usage(out)
        if b'"error"' in out and any(m in out for m in _ERROR_MARKS):
            self.error = True
        if b"data: [DONE]" in out:
            self.done = True
        self.events += out.count(b"data: ")
        return out

    def _take_usage(self, out: bytes) -> bytes:
        kept: list[bytes] = []
        stripped = False
        start = 0
        for blank in _BLANK_LINE.finditer(out):
            event, start = out[start : blank.end()], blank.end()
            if any(m in event for m in _USAGE_MARKS) and event.startswith(b"data: "):
                try:
                    obj = orjson.loads(event[6:])  # the line end after the JSON is JSON whitespace
                except orjson.JSONDecodeError:
                    kept.append(event)
                    continue
                usage = usage_from(obj)
                if usage is not None:
                    self.usage = usage
                    if self.strip_usage and isinstance(obj, dict) and not obj.get("choices"):
                        stripped = True
                        continue
            kept.append(event)
        if not stripped:
            return out
        kept.append(out[start:])
        return b"".join(kept)


def _last_event_end(buf: bytes, start: int, final: bool) -> int:
    """The end of the last whole event in `buf[start:]` (which starts at an event boundary), or
    `start` if none. An event ends after an empty line, i.e. a line end right after a line end: LF
    then LF, LF then CR(LF), CR then CR(LF). A CR as the very last byte ends a line only when the
    stream is over (`final`): otherwise the next read may bring its LF."""
    n = len(buf)
    best = start
    i = buf.rfind(b"\n\n", start)
    if i >= 0:
        best = i + 2
    limit = n if final else n - 1
    # A pair may straddle `start`: the byte before it ended the previous event's blank line.
    lookback = start - 1 if start > 0 else 0
    for pair in (b"\n\r", b"\r\r"):
        i = buf.rfind(pair, lookback, limit)
        if i >= 0:
            e = i + 2
            if e < n and buf[e] == 0x0A:  # the empty line ended in CRLF
                e += 1
            best = max(best, e)
    return best
