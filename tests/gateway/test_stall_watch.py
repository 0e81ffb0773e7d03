"""StallWatch: one timer bounds each wait on either side, names the side that ran out of time, and
leaves a cancellation from anyone else alone."""

from __future__ import annotations

import asyncio

import pytest

from gateway.stall_watch import StallWatch

WAIT = 5.0  # bound on what should take a fraction of a second


async def wait_forever() -> None:
    await asyncio.Event().wait()


@pytest.mark.parametrize(("moves", "side"), [(0, "client"), (1, "replica"), (2, "client"), (5, "replica")])
async def test_a_wait_that_lasts_its_window_ends_naming_its_side(moves: int, side: str) -> None:
    loop = asyncio.get_running_loop()
    watch = StallWatch(replica_s=0.2, client_s=0.3)
    async with asyncio.timeout(WAIT):
        with pytest.raises(TimeoutError):
            async with watch:
                watch.step += moves
                began = loop.time()
                await wait_forever()
    assert watch.expired == side
    assert loop.time() - began >= (0.2 if side == "replica" else 0.3)  # never before its window


async def test_each_side_has_its_own_window() -> None:
    """A client wait longer than the replica's window is fine, and so is a stream that keeps moving
    for many windows."""
    watch = StallWatch(replica_s=0.1, client_s=1.0)
    async with asyncio.timeout(WAIT), watch:
        await asyncio.sleep(0.3)  # on the client's side (step 1): 3 replica windows, within its own
        for _ in range(20):  # 1 s of progress: 10 replica windows
            watch.step += 1
            await asyncio.sleep(0.05)
            watch.step += 1
    assert watch.expired is None


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    watch = StallWatch(replica_s=WAIT, client_s=WAIT)

    async def guarded() -> None:
        async with watch:
            await wait_forever()

    task = asyncio.ensure_future(guarded())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert watch.expired is None


async def test_the_timer_is_gone_once_the_block_ends() -> None:
    watch = StallWatch(replica_s=0.05, client_s=0.05)
    async with watch:
        pass
    await asyncio.sleep(0.2)  # a timer left behind would cancel this task now
    assert watch.expired is None


def test_windows_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StallWatch(replica_s=0, client_s=1)
