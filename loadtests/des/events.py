"""The discrete-event core: a virtual clock and a heap of timed events.

Time is virtual: seconds on the simulated fleet's clock, starting at 0. Nothing here sleeps or reads a
wall clock; `pop()` jumps the clock to the next event's time.

Order: events pop by time, and events at the same time in the order they were pushed (a sequence
number breaks ties), so a run is a deterministic function of what is pushed. An event is a `kind` (a
small int the caller defines) and one `arg` (a replica index, a request, ...) whose meaning the kind
gives; the queue never looks at either.

Cost: one tuple and one heap operation per push and per pop (about 1 µs together on this machine),
which is why events are plain tuples rather than objects.

Owned by one simulation run; not thread-safe.
"""

from __future__ import annotations

import heapq
from typing import Any


class EventQueue:
    """A virtual clock (`now`, seconds) and its pending events.

    `processed` counts popped events. Pushing an event before `now` is a bug in the caller and raises
    ValueError: virtual time never runs backwards.
    """

    __slots__ = ("_heap", "_seq", "now", "processed")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.processed = 0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def clock(self) -> float:
        """The current virtual time; pass the bound method where a `clock()` callable is wanted."""
        return self.now

    def push(self, time: float, kind: int, arg: Any = None) -> None:
        """Schedule `(kind, arg)` at virtual `time` (>= `now`)."""
        if time < self.now:
            raise ValueError(f"event at {time} is before the clock ({self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, kind, arg))

    def pop(self) -> tuple[int, Any]:
        """Advance the clock to the earliest event and return its `(kind, arg)`; IndexError if empty."""
        time, _, kind, arg = heapq.heappop(self._heap)
        self.now = time
        self.processed += 1
        return kind, arg

    def peek_time(self) -> float | None:
        """When the next event is due, or None when there is none."""
        return self._heap[0][0] if self._heap else None
