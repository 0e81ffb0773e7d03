"""Hands a workload's specs to the runner while keeping each session's requests in order.

The spec contract (`spec.py`): requests sharing a `session_id` go one at a time, in workload order.
`SessionSequencer` enforces it: it reads the workload ahead, holds a session's next spec back while
that session has a request in flight, and releases it when `finished` is called for the previous one.
Specs without a session pass straight through, so a workload without sessions is sent in order.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Iterator

from loadtests.workloads.spec import RequestSpec

# Specs held back behind busy sessions before the sequencer stops reading ahead.
MAX_HELD = 100_000


class Hold(enum.Enum):
    """`take()`'s answer when nothing can go now but a held spec will once its session frees."""

    WAIT = "wait"


class SessionSequencer:
    """Specs in workload order with per-session sequencing, up to `max_requests` (None: all).

    Owned by one run and used from one event loop only (`get` waits on an `asyncio.Event`).
    `dispensed` counts the specs handed out.
    """

    def __init__(self, specs: Iterator[RequestSpec], max_requests: int | None = None) -> None:
        self._specs = specs
        self._left = max_requests
        self._ready: deque[RequestSpec] = deque()
        self._held: dict[str, deque[RequestSpec]] = {}
        self._held_count = 0
        self._busy: set[str] = set()
        self._exhausted = False
        self._stopped = False
        self._changed = asyncio.Event()
        self.dispensed = 0

    def stop(self) -> None:
        """Hand out nothing more from now on; wakes every waiter (each gets None)."""
        self._stopped = True
        self._changed.set()

    def take(self) -> RequestSpec | Hold | None:
        """The next spec; `Hold.WAIT` if only specs of busy sessions remain (or the read-ahead is
        full); None when there will be no more."""
        if self._stopped or self._left == 0:
            return None
        spec = self._ready.popleft() if self._ready else self._pull()
        if isinstance(spec, RequestSpec):
            self.dispensed += 1
            if self._left is not None:
                self._left -= 1
        return spec

    async def get(self) -> RequestSpec | None:
        """The next spec, waiting for a session to free if need be; None when there will be no more."""
        while True:
            spec = self.take()
            if spec is not Hold.WAIT:
                return spec
            self._changed.clear()
            await self._changed.wait()

    def finished(self, spec: RequestSpec) -> None:
        """`spec` has ended, whatever the outcome: its session's next held spec becomes ready."""
        session = spec.session_id
        if session is None:
            return
        queue = self._held.get(session)
        if queue:
            # The session stays busy: the spec now ready has claimed it.
            self._ready.append(queue.popleft())
            self._held_count -= 1
            if not queue:
                del self._held[session]
            self._changed.set()
        else:
            self._busy.discard(session)

    def _pull(self) -> RequestSpec | Hold | None:
        while not self._exhausted and self._held_count < MAX_HELD:
            spec = next(self._specs, None)
            if spec is None:
                self._exhausted = True
                break
            session = spec.session_id
            if session is None:
                return spec
            if session in self._busy:
                self._held.setdefault(session, deque()).append(spec)
                self._held_count += 1
                continue
            self._busy.add(session)
            return spec
        return Hold.WAIT if self._held_count else None
