from __future__ import annotations

import pytest

from loadtests.des.events import EventQueue


def test_events_pop_in_time_order_and_advance_the_clock() -> None:
    q = EventQueue()
    q.push(3.0, 1, "c")
    q.push(1.0, 1, "a")
    q.push(2.0, 2, "b")
    popped = []
    while len(q):
        kind, arg = q.pop()
        popped.append((q.now, kind, arg))
    assert popped == [(1.0, 1, "a"), (2.0, 2, "b"), (3.0, 1, "c")]
    assert q.processed == 3


def test_equal_times_pop_in_push_order_whatever_the_kind_or_arg() -> None:
    q = EventQueue()
    for kind, arg in [(5, {"not": "comparable"}), (0, None), (3, [1]), (0, "x")]:
        q.push(1.0, kind, arg)
    assert [q.pop() for _ in range(4)] == [(5, {"not": "comparable"}), (0, None), (3, [1]), (0, "x")]


def test_an_event_pushed_at_the_current_time_runs_after_those_already_due() -> None:
    q = EventQueue()
    q.push(1.0, 0, "first")
    q.push(1.0, 0, "second")
    assert q.pop() == (0, "first")
    q.push(q.now, 0, "pushed while handling first")
    assert [q.pop()[1] for _ in range(2)] == ["second", "pushed while handling first"]


def test_virtual_time_never_runs_backwards() -> None:
    q = EventQueue()
    q.push(2.0, 0)
    q.pop()
    with pytest.raises(ValueError, match="before the clock"):
        q.push(1.0, 0)
    assert q.clock() == 2.0


def test_peek_and_empty_pop() -> None:
    q = EventQueue(start=5.0)
    assert q.peek_time() is None and q.now == 5.0
    q.push(7.5, 0)
    assert q.peek_time() == 7.5 and q.now == 5.0
    q.pop()
    with pytest.raises(IndexError):
        q.pop()
