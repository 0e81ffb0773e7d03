"""Frame an upstream SSE stream into whole events and pull out the usage chunk, without re-encoding.

The gateway always asks the replica for `stream_options.include_usage`, because settling a tenant's
tokens needs the real usage. When the client did not ask for it, the usage-only chunk
(`"choices": []` + `usage`) is removed from what the client sees. Every other byte passes through
as the replica wrote it.

Cost per upstream read: one `rfind`, a membership test or two, and no copies when the read ends on an
event boundary (the common case). Only a read that carries the usage chunk is parsed as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

_USAGE_MARKS = (b'"usage":{', b'"usage": {')
_ERROR_MARKS = (b'data: {"error"', b'data: {"object":"error"', b'data: {"object": "error"')


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
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._pending = buf
            return b""
        end += 2
        if end == len(buf):
            out, self._pending = buf, b""
        else:
            out, self._pending = buf[:end], buf[end:]
        if _USAGE_MARKS[0] in out or _USAGE_MARKS[1] in out:
            out = self._take_usage(out)
        if b'"error"' in out and any(m in out for m in _ERROR_MARKS):
            self.error = True
        if b"data: [DONE]" in out:
            self.done = True
        self.events += out.count(b"data: ")
        return out

    def flush(self) -> bytes:
        """Whatever partial event is left at the end of the stream (forwarded as is)."""
        rest, self._pending = self._pending, b""
        return rest

    def _take_usage(self, out: bytes) -> bytes:
        kept: list[bytes] = []
        for event in out.split(b"\n\n"):
            if not event:
                continue
            if any(m in event for m in _USAGE_MARKS) and event.startswith(b"data: "):
                try:
                    obj = orjson.loads(event[6:])
                except orjson.JSONDecodeError:
                    kept.append(event)
                    continue
                usage = usage_from(obj)
                if usage is not None:
                    self.usage = usage
                    if self.strip_usage and isinstance(obj, dict) and not obj.get("choices"):
                        continue
            kept.append(event)
        if not kept:
            return b""
        return b"\n\n".join(kept) + b"\n\n"
