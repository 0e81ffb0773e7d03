"""A simulated replica publishes KV-cache events over real ZeroMQ sockets as vLLM does, and kvgate's
decoder (the one tested on vLLM 0.32's captured frames) reads them: chat requests over HTTP, a SUB
socket and the replay ROUTER on loopback."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import httpx
import pytest
import zmq
import zmq.asyncio

from gateway.kv_events.wire import (
    REPLAY_END,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_message,
    decode_seq,
)
from simulator import tokenizer
from simulator.fleet import SimFleet
from simulator.kv_events.publisher import KVEventPublisher
from tests.simulator.kv_events.client import Subscriber, ZmqContext, replay

BS = 4
SYSTEM = "You are a terse assistant that answers in one short sentence."
TEST_S = 60.0


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    async with asyncio.timeout(TEST_S), ZmqContext() as context:
        yield context


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


def tokens(messages: list[dict[str, str]]) -> list[int]:
    return tokenizer.encode(tokenizer.render_chat(messages))


def messages(user: str, system: str | None = None) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system}] if system is not None else []
    return [*head, {"role": "user", "content": user}]


async def chat(http: httpx.AsyncClient, url: str, msgs: list[dict[str, str]], model: str | None = None,
               max_tokens: int = 2) -> None:
    body: dict[str, object] = {"messages": msgs, "max_tokens": max_tokens}
    if model is not None:
        body["model"] = model
    response = await http.post(url + "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


def publisher(fleet: SimFleet, i: int = 0) -> KVEventPublisher:
    pub = fleet.replica(i).kv_events
    assert pub is not None
    return pub


async def live(sub: Subscriber, fleet: SimFleet, http: httpx.AsyncClient, i: int = 0) -> None:
    """Subscribed for sure (warm-up requests until a batch arrives), and every batch so far received."""
    await sub.go_live(lambda n: chat(http, fleet.urls[i], messages(f"warm up {n}")))
    await drain(sub, fleet, i)


async def drain(sub: Subscriber, fleet: SimFleet, i: int = 0) -> list[EventBatch]:
    """The batches published since the last receive (a request's response comes after its batches)."""
    last = publisher(fleet, i).next_seq - 1
    if sub.batches and sub.batches[-1].seq == last:
        return []
    return await sub.recv_until(last)


def events(batches: list[EventBatch]) -> list[object]:
    return [e for b in batches for e in b.events]


async def test_events_are_off_by_default() -> None:
    async with SimFleet(replicas=2) as fleet:
        assert fleet.kv_event_endpoints == []
        assert fleet.replica(0).kv_events is None


async def test_chat_prompts_are_published_as_chains_of_their_blocks(
        ctx: zmq.asyncio.Context, http: httpx.AsyncClient) -> None:
    async with SimFleet(block_size=BS, kv_events_port=0) as fleet:
        sub = Subscriber(ctx, fleet.kv_event_endpoints[0].pub)
        await live(sub, fleet, http)
        first = messages("What is the capital of France?", SYSTEM)
        second = messages("Name two rivers.", SYSTEM)

        await chat(http, fleet.urls[0], first)
        stored = events(await drain(sub, fleet))
        assert stored and all(isinstance(e, BlockStored) for e in stored)
        chain = [h for e in stored for h in e.block_hashes]  # type: ignore[attr-defined]
        assert stored[0].parent_block_hash is None  # type: ignore[attr-defined]
        for before, after in itertools.pairwise(stored):
            assert after.parent_block_hash == before.block_hashes[-1]  # type: ignore[attr-defined]
        ids = [t for e in stored for t in e.token_ids]  # type: ignore[attr-defined]
        prompt = tokens(first)
        full = len(prompt) // BS * BS
        assert ids[:full] == prompt[:full]  # the engine's own tokens, chat template applied
        assert len(ids) == len(chain) * BS and all(e.block_size == BS for e in stored)  # type: ignore[attr-defined]
        assert all(0 <= h < 2**64 for h in chain)

        await chat(http, fleet.urls[0], second)
        (batch, *_) = await drain(sub, fleet)
        head = batch.events[0]
        assert isinstance(head, BlockStored)
        assert head.parent_block_hash in chain  # the shared system prompt's blocks are hits, not stored
        shared = chain.index(head.parent_block_hash) + 1
        prompt2 = tokens(second)
        assert prompt2[: shared * BS] == prompt[: shared * BS]
        assert list(head.token_ids) == prompt2[shared * BS : shared * BS + len(head.token_ids)]
        sub.close()


async def test_sequences_count_from_zero_and_replay_returns_them_in_order_then_the_end(
        ctx: zmq.asyncio.Context, http: httpx.AsyncClient) -> None:
    async with SimFleet(block_size=BS, kv_events_port=0) as fleet:
        endpoints = fleet.kv_event_endpoints[0]
        sub = Subscriber(ctx, endpoints.pub)
        await live(sub, fleet, http)
        for n in range(3):
            await chat(http, fleet.urls[0], messages(f"Question {n}: what is {n} plus {n}?"))
        await drain(sub, fleet)
        seqs = [b.seq for b in sub.batches]
        assert seqs == list(range(seqs[0], seqs[-1] + 1))  # live: consecutive, none lost

        frames = await replay(ctx, endpoints.replay, 0)
        assert [decode_seq(f[1]) for f in frames] == [*range(seqs[-1] + 1), REPLAY_END]
        assert frames[-1] == [b"", (-1).to_bytes(8, "big", signed=True), b""]
        replayed = {decode_seq(f[1]): f[2] for f in frames[:-1]}
        for live_frames in sub.frames:  # the same payload bytes live and replayed
            assert replayed[decode_seq(live_frames[1])] == live_frames[2]
        assert all(decode_message(f).events for f in frames[:-1])  # [b"", seq, payload]: topic ""

        tail = await replay(ctx, endpoints.replay, seqs[-1])
        assert [decode_seq(f[1]) for f in tail] == [seqs[-1], REPLAY_END]
        assert [decode_seq(f[1]) for f in await replay(ctx, endpoints.replay, seqs[-1] + 5)] == [REPLAY_END]
        sub.close()


async def test_replay_keeps_only_the_last_buffer_steps_and_ignores_malformed_requests(
        ctx: zmq.asyncio.Context, http: httpx.AsyncClient) -> None:
    async with SimFleet(block_size=BS, kv_events_port=0, kv_events_buffer_steps=2) as fleet:
        for n in range(3):
            await chat(http, fleet.urls[0], messages(f"Distinct question number {n}?"))
        last = publisher(fleet).next_seq - 1
        assert last >= 2
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(fleet.kv_event_endpoints[0].replay)
        await dealer.send_multipart([b"", b"\x00" * 8, b"extra"])  # 4 frames at the ROUTER: ignored
        dealer.close(linger=0)
        frames = await replay(ctx, fleet.kv_event_endpoints[0].replay, 0)
        assert [decode_seq(f[1]) for f in frames] == [last - 1, last, REPLAY_END]


async def test_a_small_cache_removes_blocks_it_had_stored(ctx: zmq.asyncio.Context,
                                                         http: httpx.AsyncClient) -> None:
    async with SimFleet(block_size=BS, kv_blocks=16, kv_events_port=0) as fleet:
        sub = Subscriber(ctx, fleet.kv_event_endpoints[0].pub)
        await live(sub, fleet, http)
        # What the cache holds so far, from the replay buffer (every batch since seq 0): the SUB socket
        # misses the batches published before its subscription took effect (ZeroMQ's slow joiner),
        # and a warm-up request's blocks stored then may be the first this small cache evicts.
        known: set[int] = set()
        start = await replay(ctx, fleet.kv_event_endpoints[0].replay, 0)
        for e in events([decode_message(f) for f in start[:-1]]):
            if isinstance(e, BlockStored):
                known |= set(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                known -= set(e.block_hashes)
        removed = 0
        for n in range(6):
            await chat(http, fleet.urls[0], messages(f"Tell me about topic number {n} in a few words."))
            for e in events(await drain(sub, fleet)):
                if isinstance(e, BlockStored):
                    assert not known & set(e.block_hashes)
                    known |= set(e.block_hashes)
                else:
                    assert isinstance(e, BlockRemoved) and len(e.block_hashes) == 1
                    assert e.block_hashes[0] in known  # only blocks stored before are removed
                    known.discard(e.block_hashes[0])
                    removed += 1
        assert removed > 0
        assert len(known) <= 16
        sub.close()


async def test_reset_publishes_all_blocks_cleared_with_the_next_step(ctx: zmq.asyncio.Context,
                                                                    http: httpx.AsyncClient) -> None:
    async with SimFleet(block_size=BS, kv_events_port=0) as fleet:
        sub = Subscriber(ctx, fleet.kv_event_endpoints[0].pub)
        await live(sub, fleet, http)
        assert (await http.post(fleet.urls[0] + "/reset_prefix_cache")).status_code == 200
        await chat(http, fleet.urls[0], messages("After the reset."))
        (batch, *_) = await drain(sub, fleet)
        assert isinstance(batch.events[0], AllBlocksCleared)
        assert isinstance(batch.events[1], BlockStored) and batch.events[1].parent_block_hash is None
        sub.close()


async def test_adapter_blocks_carry_the_adapter_and_the_topic_is_configurable(
        ctx: zmq.asyncio.Context, http: httpx.AsyncClient) -> None:
    async with SimFleet(block_size=BS, kv_events_port=0, kv_events_topic="kv", max_loras=2,
                        adapters=("sql-lora", "chat-lora")) as fleet:
        sub = Subscriber(ctx, fleet.kv_event_endpoints[0].pub, topic=b"kv")
        await live(sub, fleet, http)
        await chat(http, fleet.urls[0], messages("SELECT the answer", SYSTEM), model="chat-lora")
        stored = [e for e in events(await drain(sub, fleet)) if isinstance(e, BlockStored)]
        assert stored
        for e in stored:
            assert (e.lora_name, e.lora_id) == ("chat-lora", 2)  # vLLM's lora_int_id: load order from 1
            assert e.extra_keys == (("chat-lora",),) * len(e.block_hashes)
        assert {f[0] for f in sub.frames} == {b"kv"}
        sub.close()


async def test_a_restarted_replica_publishes_from_sequence_zero_on_the_same_ports(
        ctx: zmq.asyncio.Context, http: httpx.AsyncClient) -> None:
    async with SimFleet(replicas=2, block_size=BS, kv_events_port=0) as fleet:
        before = fleet.kv_event_endpoints
        assert len({e.pub for e in before} | {e.replay for e in before}) == 4
        sub = Subscriber(ctx, before[1].pub)
        await live(sub, fleet, http, i=1)
        await chat(http, fleet.urls[1], messages("One more before the restart."))
        await drain(sub, fleet, i=1)
        assert publisher(fleet, 1).next_seq > 1

        await fleet.restart_replica(1)
        assert fleet.kv_event_endpoints == before
        assert publisher(fleet, 1).next_seq == 0  # a new process numbers from 0 again
        # The same SUB socket reconnects by itself and receives the new publisher's numbering.
        again = await sub.go_live(lambda n: chat(http, fleet.urls[1], messages(f"after restart {n}")))
        again_payload = sub.frames[-1][2]
        await drain(sub, fleet, i=1)
        frames = await replay(ctx, before[1].replay, 0)
        assert [decode_seq(f[1]) for f in frames] == [*range(publisher(fleet, 1).next_seq), REPLAY_END]
        assert frames[again.seq][2] == again_payload
        assert publisher(fleet, 0).next_seq == 0  # replica 0 never published
        sub.close()


def test_the_thread_handle_exposes_the_endpoints_and_serves_replays() -> None:
    handle = SimFleet.start_in_thread(replicas=2, kv_events_port=0)
    ctx = zmq.Context()
    try:
        assert len(handle.kv_event_endpoints) == 2
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(handle.kv_event_endpoints[1].replay)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert dealer.poll(5000), "no replay answer"
        assert dealer.recv_multipart() == [b"", (-1).to_bytes(8, "big", signed=True), b""]  # nothing yet
    finally:
        ctx.destroy(linger=0)
        handle.stop()
