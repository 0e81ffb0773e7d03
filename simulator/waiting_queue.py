"""The engine's queue of requests waiting for admission: first come first served, or by priority.

Both orders match vLLM V1's `--scheduling-policy`: "fcfs" admits in arrival order and puts preempted
and skipped requests back at the front; "priority" admits by (priority, arrival), lower first, and a
request put back simply takes its place in that order again. Owned by one engine; not thread-safe.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Protocol

from simulator.request import RequestState


class WaitingQueue(Protocol):
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[RequestState]:
        """In admission order."""
        ...

    def add(self, state: RequestState) -> None:
        """A new arrival."""

    def peek(self) -> RequestState: ...
    def pop(self) -> RequestState: ...
    def put_back(self, states: Iterable[RequestState]) -> None:
        """Requests that were at the head (skipped or preempted), in their order, go back in front."""

    def remove(self, state: RequestState) -> None: ...


class FcfsQueue:
    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[RequestState] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[RequestState]:
        return iter(self._q)

    def add(self, state: RequestState) -> None:
        self._q.append(state)

    def peek(self) -> RequestState:
        return self._q[0]

    def pop(self) -> RequestState:
        return self._q.popleft()

    def put_back(self, states: Iterable[RequestState]) -> None:
        self._q.extendleft(reversed(list(states)))

    def remove(self, state: RequestState) -> None:
        self._q.remove(state)


class PriorityQueue:
    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, RequestState]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[RequestState]:
        return (entry[3] for entry in sorted(self._heap, key=_order))

    def add(self, state: RequestState) -> None:
        heapq.heappush(self._heap, (state.priority, state.arrival, state.order, state))

    def peek(self) -> RequestState:
        return self._heap[0][3]

    def pop(self) -> RequestState:
        return heapq.heappop(self._heap)[3]

    def put_back(self, states: Iterable[RequestState]) -> None:
        for state in states:
            self.add(state)

    def remove(self, state: RequestState) -> None:
        self._heap = [e for e in self._heap if e[3] is not state]
        heapq.heapify(self._heap)


def _order(entry: tuple[int, float, int, RequestState]) -> tuple[int, float, int]:
    return entry[0], entry[1], entry[2]


def make_waiting_queue(policy: str) -> WaitingQueue:
    """The queue for vLLM's `--scheduling-policy` value ("fcfs" or "priority")."""
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"unknown scheduling_policy {policy!r}; expected 'fcfs' or 'priority'")
