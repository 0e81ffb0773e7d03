"""Request ids: the client's `x-request-id` when it is a sane one, else a new one.

The id goes to the replica (`x-request-id`: vLLM takes it as its own request id with
`--enable-request-id-headers`, so its logs line up with kvgate's), back to the client on every
response, and into the access log line. A client's id is kept when it is 1-128 characters of
`[A-Za-z0-9._:/+=-]` (what UUIDs, W3C trace ids and most tracers' ids are made of); anything else is
replaced, so a header value or log line can never be broken by it.

New ids are a random per-process prefix and a counter: unique across gateway processes, cheap (no
system call per request), and ordered within one process.
"""

from __future__ import annotations

import itertools
import os
import re

_SANE = re.compile(rb"[A-Za-z0-9._:/+=-]{1,128}")


class RequestIds:
    """One per Gateway; one event loop (the counter is not locked)."""

    __slots__ = ("_counter", "_prefix")

    def __init__(self, prefix: str | None = None) -> None:
        self._prefix = (prefix if prefix is not None else os.urandom(6).hex()).encode("ascii")
        self._counter = itertools.count(1)

    def accept_or_new(self, given: bytes | None) -> bytes:
        """The id for one request: `given` (the client's header) if sane, else a new one."""
        if given is not None and _SANE.fullmatch(given):
            return given
        return b"%s-%x" % (self._prefix, next(self._counter))
