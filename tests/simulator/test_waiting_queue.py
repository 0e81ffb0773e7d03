"""The waiting queue's two orders."""

from __future__ import annotations

import pytest

from simulator.engine import EngineRequest
from simulator.request import RequestState
from simulator.waiting_queue import WaitingQueue, make_waiting_queue


def state(name: str, priority: int, arrival: float, order: int) -> RequestState:
    return RequestState(EngineRequest(name, [1], 1, priority=priority), arrival, order, 0)


def names(queue: WaitingQueue) -> list[str]:
    return [s.request_id for s in queue]


A, B, C, D = state("a", 2, 0.0, 0), state("b", 1, 1.0, 1), state("c", 1, 2.0, 2), state("d", 0, 3.0, 3)


@pytest.mark.parametrize(
    ("policy", "expected"), [("fcfs", ["a", "b", "c", "d"]), ("priority", ["d", "b", "c", "a"])]
)
def test_admission_order(policy: str, expected: list[str]) -> None:
    q = make_waiting_queue(policy)
    for s in (A, B, C, D):
        q.add(s)
    assert names(q) == expected
    assert q.peek().request_id == expected[0]
    assert [q.pop().request_id for _ in range(4)] == expected
    assert len(q) == 0


@pytest.mark.parametrize(
    ("policy", "expected"), [("fcfs", ["b", "c", "a", "d"]), ("priority", ["d", "b", "c", "a"])]
)
def test_put_back_goes_in_front_or_in_order(policy: str, expected: list[str]) -> None:
    q = make_waiting_queue(policy)
    for s in (A, D):
        q.add(s)
    q.put_back([B, C])
    assert names(q) == expected


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_remove(policy: str) -> None:
    q = make_waiting_queue(policy)
    for s in (A, B, C, D):
        q.add(s)
    q.remove(C)
    assert "c" not in names(q)
    assert len(q) == 3


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="fcfs"):
        make_waiting_queue("random")
