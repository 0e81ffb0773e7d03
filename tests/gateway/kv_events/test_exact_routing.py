"""Routing on the exact index over real HTTP and real ZeroMQ: kvgate in front of simulated replicas
whose KV events come from stand-in publishers on 127.0.0.1 (the simulator does not publish yet).

The publishers say which replica's engine holds a prompt's blocks; the request goes there, and when
the events move the blocks, the next request follows them even though kvgate's own approximate
picture says otherwise. A replica without events stays on the approximate index; /metrics says which
index each replica is routed on.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from simulator import tokenizer as sim_tokenizer
from tests.gateway.kv_events.publisher import FakePublisher, batch, removed, stored
from tests.gateway.stack import MODEL, chat, metric_value, stack, wait_for

BLOCK = 16  # SimFleet's default engine block size
PROMPT = "You are a careful assistant for the exact prefix index test. " * 12


def engine_blocks(text: str) -> tuple[list[int], list[int]]:
    """(token ids of the full blocks, one made-up engine hash per block) of a one-message chat as a
    simulated engine tokenises it (ids unfolded: they reach 2**35)."""
    ids = sim_tokenizer.encode(sim_tokenizer.render_chat([{"role": "user", "content": text}]))
    full = len(ids) // BLOCK * BLOCK
    return ids[:full], [1000 + i for i in range(full // BLOCK)]


async def mode(client: httpx.AsyncClient, replica: str, which: str) -> float:
    return await metric_value(client, "kvgate_prefix_index_mode", {"replica": replica, "mode": which})


async def test_requests_follow_the_blocks_the_events_report() -> None:
    async with FakePublisher() as p0, FakePublisher() as p1:
        pubs = {"r0": p0, "r1": p1}
        per_replica = {
            name: {"kv_events": p.endpoint, "kv_events_replay": p.replay_endpoint} for name, p in pubs.items()
        }
        config = {"models": [{"name": MODEL, "tokenizer": "sim"}], "scheduling": {"profile": "prefix-only"}}
        async with stack(replicas=3, config=config, per_replica=per_replica) as s:
            for p in pubs.values():
                await p.wait_subscribed()
                await p.publish(batch(0, []))  # each engine's first batch: its picture is complete
            kv = s.gateway.kv_events
            await wait_for(lambda: all(kv.mode(n, time.monotonic()) == "exact" for n in pubs))
            assert await mode(s.client, "r0", "exact") == 1
            assert await mode(s.client, "r2", "approximate") == 1  # no events configured
            assert await mode(s.client, "r2", "exact") == 0

            ids, hashes = engine_blocks(PROMPT)
            await p1.publish(batch(1, [stored(hashes, None, ids, BLOCK)]))
            await wait_for(lambda: kv.index.blocks("r1") == len(hashes))
            r = await s.client.post("/v1/chat/completions", json=chat(PROMPT))
            assert r.status_code == 200
            assert r.headers["x-kvgate-replica"] == "r1"

            # The blocks move to r0 (r1 evicted them): kvgate's own picture still says r1; the events win.
            await p1.publish(batch(2, [removed(hashes)]))
            await p0.publish(batch(1, [stored(hashes, None, ids, BLOCK)]))
            await wait_for(lambda: kv.index.blocks("r1") == 0 and kv.index.blocks("r0") == len(hashes))
            router = s.gateway.router
            keys = router.prompt_facts("chat", chat(PROMPT), MODEL, None).prefix_keys
            assert router.index.match(keys, ("r0", "r1", "r2")) == {"r1": len(keys)}
            r = await s.client.post("/v1/chat/completions", json=chat(PROMPT))
            assert r.headers["x-kvgate-replica"] == "r0"
            assert await metric_value(s.client, "kvgate_kv_events_total", {"replica": "r1"}) == 2
            assert await metric_value(s.client, "kvgate_exact_index_blocks", {"replica": "r0"}) == len(hashes)


async def test_a_replica_whose_events_stop_while_it_works_falls_back_to_the_approximate_index() -> None:
    async with FakePublisher() as p0:
        config = {
            "models": [{"name": MODEL, "tokenizer": "sim"}],
            "scheduling": {"prefix_index": {"events_stale_after_s": 0.3}},
        }
        per_replica = {"r0": {"kv_events": p0.endpoint, "kv_events_replay": p0.replay_endpoint}}
        async with stack(replicas=1, config=config, per_replica=per_replica) as s:
            await p0.wait_subscribed()
            await p0.publish(batch(0, []))
            kv = s.gateway.kv_events
            await wait_for(lambda: kv.mode("r0", time.monotonic()) == "exact")
            await asyncio.sleep(0.5)  # idle and silent past events_stale_after_s: still exact
            assert kv.mode("r0", time.monotonic()) == "exact"
            # A request goes there and nothing comes back from its publisher: stale after 0.3 s.
            r = await s.client.post("/v1/chat/completions", json=chat("a question " * 30))
            assert r.status_code == 200
            await wait_for(lambda: kv.mode("r0", time.monotonic()) == "approximate")
            assert await mode(s.client, "r0", "approximate") == 1
            await p0.wait_subscribed()  # kvgate opened its SUB socket again
            assert kv.mode("r0", time.monotonic()) == "approximate"  # until its events are heard again
            await p0.publish(batch(1, []))
            await wait_for(lambda: kv.mode("r0", time.monotonic()) == "exact")
