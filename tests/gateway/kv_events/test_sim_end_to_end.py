"""End to end with the simulator's own KV events: simulated replicas publish what their block
managers store and evict (as vLLM does), kvgate subscribes, and its exact index is each engine's
cache; requests follow it, evictions and a restarted replica included."""

from __future__ import annotations

import time

import httpx

from gateway.kv_events.service import KvEvents
from policies.exact_keys import lazy_request_keys
from simulator.kv_events.events import external_hash
from tests.gateway.stack import MODEL, Stack, chat, metric_value, stack, wait_for

BLOCK = 16
CONFIG = {"models": [{"name": MODEL, "tokenizer": "sim"}], "scheduling": {"profile": "prefix-only"}}
PROMPT = "A long shared system prompt that the exact index must find again. " * 10


def engine_cache(s: Stack, i: int) -> set[int]:
    """The block hashes replica i's engine can find now, as its events name them."""
    cache = s.fleet.replica(i).engine.kv_cache
    return {external_hash(k) for b in range(cache.num_blocks) if (k := cache.block_key(b)) is not None}


def held_blocks(s: Stack, replica: str, text: str) -> int:
    """Leading blocks of `text`'s chat prompt the exact index says `replica` holds."""
    facts = s.gateway.router.prompt_facts("chat", chat(text), MODEL, None)
    keys = lazy_request_keys(facts.token_bytes, BLOCK, MODEL, None)
    return int(s.gateway.kv_events.index.match(keys, (replica,)).get(replica, 0))


async def direct(s: Stack, i: int, text: str) -> None:
    """A request straight to replica i (kvgate routes nothing, the engine still publishes)."""
    async with httpx.AsyncClient(base_url=s.fleet.urls[i], timeout=20) as c:
        r = await c.post("/v1/chat/completions", json=chat(text))
        assert r.status_code == 200


async def heard(s: Stack, i: int) -> None:
    """Return once kvgate hears replica i's KV events: probe requests straight to it until its exact
    picture is its engine's cache. A ZeroMQ PUB drops what it sends before a new subscriber's
    subscription has reached it (the slow joiner); a test's first request, sent as soon as the
    gateway is up, could go unheard on a loaded machine, and with nothing published after it the
    gateway would never learn it missed a batch (in service, the next batch asks for a replay)."""
    kv: KvEvents = s.gateway.kv_events
    name = f"r{i}"

    def exact() -> bool:
        return kv.mode(name, time.monotonic()) == "exact" and kv.index.held_hashes(name) == engine_cache(s, i)

    for n in range(20):
        await direct(s, i, f"probe {n} " * 20)
        try:
            await wait_for(exact, timeout=1.0)
            return
        except TimeoutError:
            continue  # unheard: the next probe's batch is (and asks for a replay of the first)
    raise TimeoutError(f"{name}'s KV events never reached the gateway")


async def test_the_exact_index_is_the_engines_cache_and_requests_follow_it() -> None:
    async with stack(replicas=2, config=CONFIG, kv_events_port=0, kv_blocks=96, block_size=BLOCK) as s:
        kv: KvEvents = s.gateway.kv_events
        await heard(s, 0)
        await heard(s, 1)
        r = await s.client.post("/v1/chat/completions", json=chat(PROMPT))
        assert r.status_code == 200
        owner = r.headers["x-kvgate-replica"]
        i = int(owner[1:])
        prompt_blocks = (
            len(s.gateway.router.prompt_facts("chat", chat(PROMPT), MODEL, None).token_bytes) // 4 // BLOCK
        )
        await wait_for(lambda: held_blocks(s, owner, PROMPT) == prompt_blocks)
        assert kv.mode(owner, time.monotonic()) == "exact"
        assert (
            await metric_value(s.client, "kvgate_prefix_index_mode", {"replica": owner, "mode": "exact"}) == 1
        )
        await wait_for(lambda: kv.index.held_hashes(owner) == engine_cache(s, i))

        for _ in range(3):  # the same prompt goes back to the replica whose engine holds it
            r = await s.client.post("/v1/chat/completions", json=chat(PROMPT))
            assert r.headers["x-kvgate-replica"] == owner

        # Other prompts sent straight to it evict the shared prompt: the exact index follows the
        # engine, while kvgate's own approximate picture still says the replica holds it.
        for n in range(12):
            await direct(s, i, f"unrelated prompt number {n} " * 20)
        await wait_for(lambda: kv.index.held_hashes(owner) == engine_cache(s, i))
        assert held_blocks(s, owner, PROMPT) < prompt_blocks
        feed = kv.feed(owner)
        assert feed is not None
        assert feed.tracker.losses == 0 and feed.invalid == 0


async def test_a_restarted_replica_starts_its_picture_over() -> None:
    async with stack(replicas=1, config=CONFIG, kv_events_port=0, block_size=BLOCK) as s:
        kv: KvEvents = s.gateway.kv_events
        r = await s.client.post("/v1/chat/completions", json=chat(PROMPT))
        assert r.status_code == 200
        await wait_for(lambda: kv.index.blocks("r0") > 0 and kv.index.held_hashes("r0") == engine_cache(s, 0))
        await s.fleet.restart_replica(0)  # a new process: empty cache, sequence from 0 again
        await direct(s, 0, "the first prompt of the new engine " * 20)
        feed = kv.feed("r0")
        assert feed is not None
        # Exact again once the new engine's picture is in: not necessarily at the moment it matches,
        # since the subscriber's reconnection, noticed after the new engine's first batch under load,
        # asks the replay socket whether this is the same engine, and the picture is approximate
        # until that answer comes (seen in CI).
        try:
            await wait_for(
                lambda: (
                    feed.tracker.restarts == 1
                    and kv.index.held_hashes("r0") == engine_cache(s, 0)
                    and kv.mode("r0", time.monotonic()) == "exact"
                )
            )
        except TimeoutError:
            t = feed.tracker
            raise AssertionError(
                f"restarts {t.restarts}, replaying {t.replaying}, reconnects {t.reconnects}, losses"
                f" {t.losses}, complete {kv.index.complete('r0')}, mode {kv.mode('r0', time.monotonic())},"
                f" picture == engine {kv.index.held_hashes('r0') == engine_cache(s, 0)}"
            ) from None
        assert held_blocks(s, "r0", PROMPT) == 0
