from __future__ import annotations

import asyncio

import pytest

from loadtests.workloads.sequencer import Hold, SessionSequencer
from loadtests.workloads.spec import RequestSpec


def spec(rid: str, session: str | None = None) -> RequestSpec:
    return RequestSpec(request_id=rid, endpoint="chat", body={}, session_id=session)


def ids(items: list[RequestSpec | Hold | None]) -> list[str | None]:
    return [x.request_id if isinstance(x, RequestSpec) else (None if x is None else "WAIT") for x in items]


def test_specs_without_sessions_pass_in_order() -> None:
    seq = SessionSequencer(iter([spec("a"), spec("b"), spec("c")]))
    assert ids([seq.take(), seq.take(), seq.take(), seq.take()]) == ["a", "b", "c", None]
    assert seq.dispensed == 3


def test_a_busy_session_holds_its_next_turn_and_others_go_ahead() -> None:
    s1, s2, x, s3 = spec("s1", "A"), spec("s2", "A"), spec("x"), spec("s3", "A")
    seq = SessionSequencer(iter([s1, s2, x, s3]))
    assert ids([seq.take(), seq.take()]) == ["s1", "x"]  # s2 waits for s1; x does not
    assert seq.take() is Hold.WAIT
    seq.finished(s1)
    assert ids([seq.take(), seq.take()]) == ["s2", "WAIT"]
    seq.finished(s2)
    assert ids([seq.take(), seq.take()]) == ["s3", None]
    seq.finished(s3)
    assert seq.take() is None


def test_max_requests_and_stop() -> None:
    seq = SessionSequencer(iter([spec(str(i)) for i in range(10)]), max_requests=3)
    assert ids([seq.take() for _ in range(4)]) == ["0", "1", "2", None]
    seq = SessionSequencer(iter([spec(str(i)) for i in range(10)]))
    seq.take()
    seq.stop()
    assert seq.take() is None


@pytest.mark.timeout(5)
async def test_get_waits_for_the_session_to_free() -> None:
    first, second = spec("t1", "conv"), spec("t2", "conv")
    seq = SessionSequencer(iter([first, second]))
    assert await seq.get() is first
    waiter = asyncio.create_task(seq.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    seq.finished(first)
    assert await waiter is second


@pytest.mark.timeout(5)
async def test_stop_wakes_waiters_with_none() -> None:
    first = spec("t1", "conv")
    seq = SessionSequencer(iter([first, spec("t2", "conv")]))
    await seq.get()
    waiter = asyncio.create_task(seq.get())
    await asyncio.sleep(0)
    seq.stop()
    assert await waiter is None
