"""The subscriber over real ZeroMQ sockets on 127.0.0.1, fed the frames a real vLLM 0.32 published:
in order, with a gap its replay fills, a gap it cannot, a restart (also one that published while the
connection was down), garbage, a silent replay socket,
a subscriber that joins mid-stream and one that resubscribes when the events go stale."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence

import zmq.asyncio

from gateway.kv_events.feed import ReplicaFeed
from gateway.kv_events.subscriber import Subscriber
from gateway.kv_events.wire import encode_seq
from policies.exact_index import ExactIndex
from tests.gateway.kv_events.captured import CapturedMessage, captured
from tests.gateway.kv_events.publisher import FakePublisher
from tests.gateway.stack import wait_for

STORED = captured("stored")  # seq 0-5
EVICTED = captured("evicted")  # seq 6-11, the same server
ALL = STORED + EVICTED
ENGINE_BLOCKS = 64  # the captured server's --num-gpu-blocks-override


def held_after(messages: Sequence[CapturedMessage], unkeyable: frozenset[int] = frozenset()) -> set[int]:
    """Engine hashes stored and not removed by `messages`, from the capture's own JSON decoding."""
    held: set[int] = set()
    for m in messages:
        for e in m.decoded[1]:
            if e["type"] == "BlockStored" and e["parent_block_hash"] not in unkeyable:
                held |= set(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                held -= set(e["block_hashes"])
    return held


@contextlib.asynccontextmanager
async def subscribed(
    pub: FakePublisher,
    capacity: int = ENGINE_BLOCKS,
    replay_timeout_s: float = 5.0,
    stale_after_s: float = 60,
) -> AsyncIterator[tuple[ReplicaFeed, Subscriber]]:
    index = ExactIndex(10_000)
    index.add_replica("r", "tiny", capacity)
    feed = ReplicaFeed("r", index, can_replay=pub.replay_endpoint is not None, stale_after_s=stale_after_s)
    ctx = zmq.asyncio.Context()
    sub = Subscriber(ctx, feed, pub.endpoint, pub.replay_endpoint, replay_timeout_s=replay_timeout_s)
    task = asyncio.create_task(sub.run())
    try:
        await pub.wait_subscribed()
        yield feed, sub
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        ctx.destroy(linger=0)


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    await wait_for(cond, timeout, 0.01)


def settled(feed: ReplicaFeed, seq: int) -> Callable[[], bool]:
    return lambda: feed.tracker.expected == seq + 1 and not feed.tracker.replaying


async def test_the_index_ends_holding_exactly_the_blocks_stored_and_not_removed() -> None:
    async with FakePublisher() as pub, subscribed(pub) as (feed, _):
        for m in ALL:
            await pub.publish(m.frames)
        await until(settled(feed, 11))
        want = held_after(ALL)
        assert len(want) == 62
        assert feed.index.held_hashes("r") == want
        assert feed.index.blocks("r") == 62
        assert feed.exact(time.monotonic())  # complete: it saw the engine's first batch
        assert feed.unkeyable == 0 and feed.invalid == 0 and feed.tracker.replays == 0


async def test_a_gap_is_filled_by_the_replay_socket() -> None:
    async with FakePublisher() as pub, subscribed(pub) as (feed, _):
        for m in ALL[:8]:
            await pub.publish(m.frames, live=m.seq not in (3, 4))
        await until(settled(feed, 7))
        for m in ALL[8:]:
            await pub.publish(m.frames, live=m.seq != 8)
        await until(settled(feed, 11))
        assert feed.index.held_hashes("r") == held_after(ALL)
        assert pub.replay_requests == [3, 8]
        assert feed.tracker.gaps == 2 and feed.tracker.replays_filled == 2 and feed.tracker.losses == 0
        assert feed.exact(time.monotonic())


async def test_a_gap_the_replay_buffer_no_longer_holds_starts_the_index_over() -> None:
    async with FakePublisher() as pub, subscribed(pub, capacity=200) as (feed, _):
        for m in ALL[:3]:
            await pub.publish(m.frames)
        for m in ALL[3:5]:
            await pub.publish(m.frames, live=False)
        pub.forget_before(5)  # the publisher's buffer has moved on
        for m in ALL[5:]:
            await pub.publish(m.frames)
        await until(settled(feed, 11))
        assert feed.tracker.losses == 1
        # Everything from seq 5 on, but seq 5's block: its parent was stored before the loss.
        parent = STORED[5].decoded[1][0]["parent_block_hash"]
        assert feed.unkeyable == 1
        assert feed.index.held_hashes("r") == held_after(ALL[6:]) == held_after(ALL[5:], frozenset({parent}))
        assert not feed.exact(time.monotonic())  # incomplete until 200 blocks are keyed in a row


async def test_a_restarted_engine_starts_a_complete_index_over() -> None:
    async with FakePublisher() as pub, subscribed(pub) as (feed, _):
        for m in ALL:
            await pub.publish(m.frames)
        await until(settled(feed, 11))
        pub.restart()
        for m in STORED:  # the new process numbers its batches from 0 again
            await pub.publish(m.frames)
        await until(settled(feed, 5))
        assert feed.tracker.restarts == 1
        assert feed.index.held_hashes("r") == held_after(STORED)
        assert feed.exact(time.monotonic())


async def test_a_new_engine_that_published_while_the_connection_was_down_is_replayed_whole() -> None:
    async with FakePublisher() as pub, subscribed(pub) as (feed, sub):
        for m in ALL:
            await pub.publish(m.frames)
        await until(settled(feed, 11))
        await pub.restart_sockets()
        # The new engine's first batches, sent before the subscriber is back: only its replay
        # buffer keeps them (a PUB socket drops what it sends with nobody connected).
        for m in STORED[:3]:
            await pub.publish(m.frames, live=False)
        await pub.wait_subscribed()  # reconnected
        # Asked for the old engine's last batch (11) to compare; the new one has only 0-2, so the
        # answer is empty: another engine, whose history is asked for from 0 at once, not at its
        # next batch (which may be long in coming on a quiet replica).
        await until(settled(feed, 2))
        assert pub.replay_requests == [11, 0]
        assert sub.reconnects == 1 and feed.tracker.restarts == 1
        assert feed.index.held_hashes("r") == held_after(STORED[:3])
        assert feed.exact(time.monotonic())


async def test_garbage_frames_are_counted_and_skipped() -> None:
    async with FakePublisher() as pub, subscribed(pub) as (feed, _):
        await pub.publish(ALL[0].frames)
        await pub.send_raw([b"kv", b"short", b"\x90"])
        await pub.send_raw([b"kv", encode_seq(1), b"\xc1 not msgpack"])
        await pub.send_raw([b"kv", encode_seq(1)])
        await pub.send_raw([b"kv", encode_seq(1), b"\x92\x01\x91\x93\xa9BlockLost\x01\x02"])
        for m in STORED[1:]:
            await pub.publish(m.frames)
        await until(settled(feed, 5))
        assert feed.invalid == 4
        assert feed.index.held_hashes("r") == held_after(STORED)
        assert feed.tracker.gaps == 0


async def test_a_replay_that_never_answers_times_out_and_loses_the_gap() -> None:
    async with FakePublisher() as pub, subscribed(pub, capacity=200, replay_timeout_s=0.3) as (feed, _):
        pub.answer_replays = False
        for m in STORED:
            await pub.publish(m.frames, live=m.seq != 2)
        await until(lambda: feed.tracker.losses == 1 and not feed.tracker.replaying)
        assert feed.replays_failed == 1
        assert feed.tracker.expected == 6  # the held batches were applied after the loss
        assert not feed.exact(time.monotonic())


async def test_without_a_replay_socket_a_gap_is_lost_at_once() -> None:
    async with FakePublisher(replay=False) as pub, subscribed(pub, capacity=200) as (feed, _):
        for m in STORED:
            await pub.publish(m.frames, live=m.seq != 2)
        await until(settled(feed, 5))
        assert feed.tracker.losses == 1 and feed.tracker.replays == 0


async def test_a_subscriber_joining_mid_stream_asks_for_the_history() -> None:
    async with FakePublisher() as pub:
        for m in STORED:  # published before anyone listens: only the replay buffer keeps them
            await pub.publish(m.frames)
        async with subscribed(pub) as (feed, _):
            for m in EVICTED:
                await pub.publish(m.frames)
            await until(settled(feed, 11))
            assert pub.replay_requests == [0]
            assert feed.index.held_hashes("r") == held_after(ALL)
            assert feed.exact(time.monotonic())


async def test_it_resubscribes_when_the_events_go_stale_while_the_replica_works() -> None:
    async with FakePublisher() as pub, subscribed(pub, stale_after_s=0.2) as (feed, sub):
        await pub.publish(ALL[0].frames)
        await until(settled(feed, 0))
        assert feed.exact(time.monotonic())
        feed.freshness.dispatched(time.monotonic())  # a request went there, and nothing came back
        await until(lambda: not feed.exact(time.monotonic()))
        await pub.wait_subscribed()  # a second subscription: the SUB socket was opened again
        assert sub.subscriptions == 2
        assert not feed.exact(time.monotonic())  # still approximate: nothing heard yet
        await pub.publish(ALL[1].frames)
        await until(settled(feed, 1))
        assert feed.exact(time.monotonic())
