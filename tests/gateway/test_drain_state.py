"""The Drain state object (gateway/drain.py) on its own: phases in order, the queue refused when the
window ends, a return as soon as nothing is in flight, and the cut of what outlasts the timeout."""

from __future__ import annotations

import asyncio

from gateway.drain import Drain, DrainPhase, shutting_down


async def test_phases_and_an_early_return_when_nothing_is_in_flight() -> None:
    d = Drain()
    assert d.phase is DrainPhase.SERVING and not d.draining and not d.refusing
    refused: list[DrainPhase] = []
    task = asyncio.create_task(d.run(0.05, 30.0, lambda: refused.append(d.phase)))
    await asyncio.sleep(0)
    assert d.phase is DrainPhase.PROPAGATING and d.draining and not d.refusing
    assert not d.begin()  # a drain begins once
    assert await asyncio.wait_for(task, 5) == 0  # long before the 30 s timeout
    assert refused == [DrainPhase.REFUSING] and d.refusing and d.phase is DrainPhase.DONE and not d.cut


async def test_it_waits_for_the_last_request_then_returns() -> None:
    d = Drain()
    request = asyncio.create_task(asyncio.sleep(3600))
    d.enter(request)
    drain = asyncio.create_task(d.run(0.0, 30.0, lambda: None))
    await asyncio.sleep(0.05)
    assert d.phase is DrainPhase.REFUSING and d.in_flight == 1 and not drain.done()
    d.leave(request)
    assert await asyncio.wait_for(drain, 5) == 0
    assert not request.cancelled()
    request.cancel()


async def test_what_outlasts_the_timeout_is_cut() -> None:
    d = Drain()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]  # as the proxy does
            return d.cut_reason
        finally:
            d.leave(task)
        return "not cut"

    task = asyncio.create_task(stubborn())
    d.enter(task)
    assert await asyncio.wait_for(d.run(0.0, 0.05, lambda: None), 5) == 1
    assert d.cut and await task == "its 0.05s drain timeout ran out"


def test_the_refusal_is_a_fresh_503_with_retry_after_and_close() -> None:
    a, b = shutting_down(), shutting_down("why")
    assert a is not b and a.status == 503 and b.message.startswith("why; please retry")
    assert dict(a.headers) == {b"retry-after": b"1", b"connection": b"close"}
