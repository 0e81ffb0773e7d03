"""Bound each wait of a relay on either of its two sides — the replica, the client — with one timer.

A stream alternates between waiting on the replica (for the next chunk) and on the client (for its
socket to take that chunk), and a wait that lasts too long is a different fault on each side: a
stalled replica is reported and ejected, a client that stopped reading is dropped as its own doing.
`asyncio.timeout` around each wait would cost a timer-heap push per chunk, on the path where
per-chunk cost is what limits a process (DESIGN.md). Here the relay only counts its moves between
the two sides (`step += 1`: no clock read, no timer work) and one timer per stream looks at the
count every tenth of the shorter window: a count unchanged since a look means the same wait is
still going on, and when it has lasted its side's window the task is cancelled, the way
`asyncio.timeout` does it, and the block raises TimeoutError with `expired` naming the side.

A wait is detected between its window and its window plus a tenth of the shorter one (never
before). One event loop; a watch guards one task and one `async with` block, once.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Literal

Side = Literal["replica", "client"]


class StallWatch:
    """`step` odd: the task is waiting on the client (sending); even: on the replica (reading).

    It starts at 1 (the response is about to be sent). The owner adds 1 at each move; nothing else.
    """

    __slots__ = ("_cancelling", "_client_s", "_handle", "_loop", "_replica_s", "_seen", "_since", "_task",
                 "_tick", "expired", "step")  # fmt: skip

    def __init__(self, replica_s: float, client_s: float) -> None:
        """`replica_s`, `client_s`: the longest one wait on each side may last, in seconds (> 0)."""
        if replica_s <= 0 or client_s <= 0:
            raise ValueError("StallWatch windows must be > 0 seconds")
        self.step = 1
        self.expired: Side | None = None
        self._replica_s = replica_s
        self._client_s = client_s
        self._tick = min(replica_s, client_s) / 10
        self._handle: asyncio.TimerHandle | None = None
        self._seen = 0
        self._since = 0.0
        self._cancelling = 0

    async def __aenter__(self) -> StallWatch:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("StallWatch must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._loop = asyncio.get_running_loop()
        self._seen = self.step
        self._since = self._loop.time()
        self._handle = self._loop.call_at(self._since + self._tick, self._look)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # As asyncio.timeout: our cancel becomes TimeoutError unless someone else cancelled too.
        expired = self.expired is not None and self._task.uncancel() <= self._cancelling
        if expired and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"no progress on the {self.expired}'s side") from exc

    def _look(self) -> None:
        now = self._loop.time()
        step = self.step
        if step != self._seen:  # moved since the last look: the wait now going on began after it
            self._seen = step
            self._since = now
        on_client = step & 1
        due = self._since + (self._client_s if on_client else self._replica_s)
        if now >= due:
            self._handle = None
            self.expired = "client" if on_client else "replica"
            self._task.cancel()
            return
        self._handle = self._loop.call_at(min(now + self._tick, due), self._look)
