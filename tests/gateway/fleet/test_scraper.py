"""gateway/fleet/scraper.py over real loopback HTTP: a fake replica server (for pages and failures
the simulator does not produce) and the replica simulator itself."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app
from starlette.types import Message, Receive, Scope, Send

from gateway.config import FleetConfig, ReplicaConfig
from gateway.fleet.scraper import FleetScraper, build_client
from gateway.fleet.state import FleetChange, FleetState
from gateway.upstream import UpstreamPool
from simulator.fleet import SimFleet
from tests.gateway.fleet.fake_replica import FakeReplica

FAST = FleetConfig(
    scrape_interval_s=0.05, scrape_timeout_s=0.5, stale_after_s=1.0,
    health_interval_s=1000.0, health_timeout_s=0.5,  # health checks out of the way unless asked for
    eject_after_failures=2, eject_backoff_s=0.05, eject_backoff_max_s=0.2,
    models_poll_interval_s=1000.0,
)
Log = list[tuple[str, str, object]]


def fleet_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("kvgate-fleet")]


class Observer:
    """Records scrapes (and, as a listener, state changes) in one ordered log; `until` waits on it."""

    def __init__(self) -> None:
        self.log: Log = []
        self._news = asyncio.Event()

    def scrape_finished(self, replica: str, duration_s: float, error: str | None) -> None:
        assert duration_s >= 0
        self.log.append(("scrape", replica, error))
        self._news.set()

    def __call__(self, replica: str, change: FleetChange) -> None:
        self.log.append(("change", replica, change))
        self._news.set()

    async def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait (bounded) for a condition that a scrape or a state change will make true."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._news.clear()
                await self._news.wait()


@pytest.fixture
async def two_replicas() -> AsyncIterator[tuple[FakeReplica, FakeReplica]]:
    async with FakeReplica() as a, FakeReplica() as b:
        yield a, b


async def scraping(
    replicas: tuple[FakeReplica, ...], fleet: FleetConfig = FAST
) -> tuple[FleetState, FleetScraper, Observer, UpstreamPool]:
    state = FleetState([ReplicaConfig(url=r.url, model="tiny-llama", name=f"r{i}")
                        for i, r in enumerate(replicas)], fleet)
    observer = Observer()
    state.add_listener(observer)
    client = build_client(fleet)
    scraper = FleetScraper(state, fleet, client, rng=random.Random(7), observer=observer)
    await scraper.start()
    return state, scraper, observer, client


async def test_start_polls_once_then_stop_leaves_no_tasks(
    two_replicas: tuple[FakeReplica, FakeReplica],
) -> None:
    state, scraper, _, client = await scraping(two_replicas)
    try:
        snap = state.snapshot()  # populated as soon as start() returns
        assert [(r.running, r.waiting, r.block_size, r.num_gpu_blocks) for r in snap.replicas] == [
            (8, 16, 128, 16384), (8, 16, 128, 16384)]
        assert state.pool_of("lora-a") == ("tiny-llama", "lora-a")
        assert state.kv_capacity_tokens("r0") == 2_097_152
        assert all(r.healthy and r.scraped_at is not None for r in snap.replicas)
        assert fleet_tasks()  # the three loops
    finally:
        await scraper.stop()
        await client.aclose()
    assert fleet_tasks() == []


async def test_scrapes_keep_coming_and_bring_fresh_numbers(
    two_replicas: tuple[FakeReplica, FakeReplica],
) -> None:
    a, _ = two_replicas
    state, scraper, observer, client = await scraping(two_replicas)
    try:
        a.metrics_text = a.metrics_text.replace(
            'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 8.0',
            'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0')
        await observer.until(lambda: state.snapshot().replicas[0].running == 3)
        await observer.until(lambda: scraper.stats("r1").scrapes >= 5)
        stats = scraper.stats("r1")
        assert stats.failures == 0 and stats.last_error is None
        assert stats.last_duration_s is not None and stats.last_duration_s > 0
        assert state.snapshot().replicas[1].running == 8
    finally:
        await scraper.stop()
        await client.aclose()


async def test_killed_replica_is_ejected_by_its_first_failed_scrape(
    two_replicas: tuple[FakeReplica, FakeReplica],
) -> None:
    a, b = two_replicas
    state, scraper, observer, client = await scraping(two_replicas)
    try:
        await observer.until(lambda: scraper.stats("r0").scrapes >= 2)
        await a.stop()
        await observer.until(lambda: not state.snapshot().replicas[0].healthy)
        r0 = [(kind, what) for kind, name, what in observer.log if name == "r0"]
        first_failure = next(i for i, e in enumerate(r0) if e[0] == "scrape" and e[1] is not None)
        # the ejection came with the very first failed scrape, i.e. within one scrape interval
        assert r0[first_failure] == ("scrape", "connect")
        assert r0[first_failure - 1] == ("change", FleetChange.HEALTH)
        assert state.snapshot().replicas[1].healthy

        await a.start()  # the same port again: back in rotation after its backoff
        await observer.until(lambda: state.snapshot().replicas[0].healthy)
        assert b.hits["metrics"] > 0
    finally:
        await scraper.stop()
        await client.aclose()


async def test_failing_health_check_ejects_and_good_one_readmits(
    two_replicas: tuple[FakeReplica, FakeReplica],
) -> None:
    a, _ = two_replicas
    fleet = FAST.model_copy(update={"health_interval_s": 0.05})
    state, scraper, observer, client = await scraping(two_replicas, fleet)
    try:
        a.health_status = 503
        await observer.until(lambda: not state.snapshot().replicas[0].healthy)
        scrapes_while_out = scraper.stats("r0").scrapes
        await observer.until(lambda: scraper.stats("r0").scrapes >= scrapes_while_out + 5)
        assert not state.snapshot().replicas[0].healthy  # good scrapes do not override /health
        a.health_status = 200
        await observer.until(lambda: state.snapshot().replicas[0].healthy)
        health = [what for kind, name, what in observer.log
                  if name == "r0" and kind == "change" and isinstance(what, FleetChange)
                  and what & FleetChange.HEALTH]
        assert len(health) == 2
    finally:
        await scraper.stop()
        await client.aclose()


async def test_models_poll_picks_up_a_new_adapter(two_replicas: tuple[FakeReplica, FakeReplica]) -> None:
    _, b = two_replicas
    fleet = FAST.model_copy(update={"models_poll_interval_s": 0.05})
    state, scraper, observer, client = await scraping(two_replicas, fleet)
    try:
        assert state.pool_of("lora-c") is None
        b.models_body = b.models_body.replace(b'"id":"lora-b"', b'"id":"lora-c"')
        await observer.until(lambda: state.pool_of("lora-c") is not None)
        assert state.pool_of("lora-c") == ("tiny-llama", "lora-c")
        assert "lora-c" in state.snapshot().replicas[1].adapters
    finally:
        await scraper.stop()
        await client.aclose()


async def test_hung_replica_does_not_hold_back_the_others(
    two_replicas: tuple[FakeReplica, FakeReplica],
) -> None:
    a, _ = two_replicas
    state, scraper, observer, client = await scraping(two_replicas)
    try:
        a.metrics_delay_s = 30.0
        before = scraper.stats("r1").scrapes
        await observer.until(lambda: scraper.stats("r0").last_error == "timeout")
        # one scrape of r0 took the whole timeout (10 intervals); r1 went on meanwhile
        assert scraper.stats("r1").scrapes >= before + 3
        hits = a.hits["metrics"]
        await observer.until(lambda: scraper.stats("r0").failures >= 2)
        assert a.hits["metrics"] <= hits + 2  # at most one pending scrape per replica at a time
        assert not state.snapshot().replicas[0].healthy  # two timeouts in a row
    finally:
        await scraper.stop()  # cancels the pending hung scrape
        await client.aclose()
    assert fleet_tasks() == []


# -- edge cases, against the fake replica -------------------------------------------------------


async def one_round(replica: FakeReplica, fleet: FleetConfig = FAST) -> tuple[FleetState, FleetScraper]:
    state = FleetState([ReplicaConfig(url=replica.url, model="tiny-llama", name="r0")], fleet)
    client = build_client(fleet)
    scraper = FleetScraper(state, fleet, client, rng=random.Random(1))
    await scraper.start()  # one models poll and one scrape, awaited
    await scraper.stop()
    await client.aclose()
    return state, scraper


NAN_PAGE = "vllm:num_requests_running 1\nvllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 0.1\n"
EDGE = {  # (metrics status, page, delay s, failure kind)
    "timeout": (200, None, 5.0, "timeout"),
    "500": (500, "oops", 0.0, "status_5xx"),
    "404": (404, "", 0.0, "status_4xx"),
    "malformed page": (200, "<html>hi</html>", 0.0, "parse"),
    "nan gauge": (200, NAN_PAGE, 0.0, "parse"),
}


@pytest.mark.parametrize(("status", "page", "delay", "kind"), EDGE.values(), ids=EDGE.keys())
async def test_failed_scrape_kinds(status: int, page: str | None, delay: float, kind: str) -> None:
    async with FakeReplica() as replica:
        replica.metrics_status = status
        replica.metrics_delay_s = delay
        if page is not None:
            replica.metrics_text = page
        state, scraper = await one_round(replica)
    stats = scraper.stats("r0")
    assert (stats.scrapes, stats.failures, stats.last_error) == (1, 1, kind)
    r = state.snapshot().replicas[0]
    assert r.healthy  # one soft failure is below eject_after_failures=2
    assert r.scraped_at is None


async def test_refused_scrape_ejects_at_once() -> None:
    replica = FakeReplica()
    await replica.start()
    await replica.stop()  # the port now refuses
    state, scraper = await one_round(replica)
    assert scraper.stats("r0").last_error == "connect"
    assert not state.snapshot().replicas[0].healthy


async def test_failed_models_poll_keeps_the_previous_list() -> None:
    async with FakeReplica() as replica:
        replica.models_body = b'{"data":[{"id":"tiny-llama"},{"id":"x","parent":"tiny-llama"}]}'
        state = FleetState([ReplicaConfig(url=replica.url, model="tiny-llama", name="r0")], FAST)
        client = build_client(FAST)
        try:
            first = FleetScraper(state, FAST, client)
            await first.start()
            await first.stop()
            assert state.pool_of("x") == ("tiny-llama", "x")
            replica.models_body = b"not json"
            second = FleetScraper(state, FAST, client)
            await second.start()
            await second.stop()
        finally:
            await client.aclose()
    assert state.pool_of("x") == ("tiny-llama", "x")


async def test_prometheus_client_exposition_renders_only_the_families_read() -> None:
    """Against prometheus-client's own exposition app over loopback: the scraper asks it for the few
    families it reads (`name[]`) and for no compression."""
    registry = CollectorRegistry()
    labels = ["engine", "model_name"]
    for name, value in (("vllm:num_requests_running", 4), ("vllm:num_requests_waiting", 1),
                        ("vllm:kv_cache_usage_perc", 0.5)):
        Gauge(name, "doc", labels, registry=registry).labels("0", "m").set(value)
    Counter("vllm:prefix_cache_queries", "doc", labels, registry=registry).labels("0", "m").inc(640)
    Counter("vllm:prompt_tokens", "doc", labels, registry=registry).labels("0", "m").inc(9)
    Histogram("vllm:time_to_first_token_seconds", "doc", labels, registry=registry).labels("0", "m")
    Gauge("vllm:cache_config_info", "doc", ["block_size", "engine", "num_gpu_blocks"],
          registry=registry).labels("16", "0", "4096").set(1)
    exposition = make_asgi_app(registry)
    pages: dict[str, tuple[list[tuple[bytes, bytes]], bytes]] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics":
            if scope["type"] == "http":
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": b""})
            return
        head: list[tuple[bytes, bytes]] = []

        async def spy(message: Message) -> None:
            if message["type"] == "http.response.start":
                head.extend(message["headers"])
            if message["type"] == "http.response.body":
                pages["/metrics"] = (head, message["body"])
            await send(message)

        await exposition(scope, receive, spy)

    async with FakeReplica(app=app) as replica:
        state = FleetState([ReplicaConfig(url=replica.url, model="m", name="r0")], FAST)
        client = build_client(FAST)
        scraper = FleetScraper(state, FAST, client)
        await scraper.start()
        await scraper.stop()
        await client.aclose()
    r = state.snapshot().replicas[0]
    assert (r.running, r.waiting, r.kv_usage) == (4, 1, 0.5)
    assert r.kv_capacity_tokens == 16 * 4096
    head, body = pages["/metrics"]
    page = body.decode()
    assert "vllm:prefix_cache_queries_total" in page
    assert "vllm:prompt_tokens" not in page and "time_to_first_token" not in page
    assert not any(k.lower() == b"content-encoding" for k, _ in head)


# -- against the replica simulator (simulator/fleet.py) ------------------------------------------


async def scraping_sim(sim: SimFleet, fleet: FleetConfig = FAST) -> tuple[
        FleetState, FleetScraper, Observer, UpstreamPool]:
    state = FleetState([ReplicaConfig(url=u, model="tiny-llama", name=f"sim{i}")
                        for i, u in enumerate(sim.urls)], fleet)
    observer = Observer()
    state.add_listener(observer)
    client = build_client(fleet)
    scraper = FleetScraper(state, fleet, client, rng=random.Random(3), observer=observer)
    await scraper.start()
    return state, scraper, observer, client


async def test_simulated_fleet_is_read_whole() -> None:
    # time_scale 50: a 64-token request runs for seconds, long enough to be seen by scrapes
    async with SimFleet(replicas=2, profile="tiny", max_loras=2, adapters=("lora-a",),
                        time_scale=50.0) as sim:
        state, scraper, observer, client = await scraping_sim(sim)
        try:
            snap = state.snapshot()
            assert all(r.healthy and r.block_size == 16 and r.num_gpu_blocks > 0 and r.max_loras == 2
                       for r in snap.replicas)
            assert state.pool_of("lora-a") == ("tiny-llama", "lora-a")
            assert state.kv_capacity_tokens("sim0") == snap.replicas[0].kv_capacity_tokens

            # a request the (slowed) engine is still working on shows in the next scrapes
            body = {"model": "lora-a", "prompt": "hello there", "max_tokens": 64, "stream": True}
            async with httpx.AsyncClient() as http, http.stream(
                "POST", sim.urls[1] + "/v1/completions", json=body
            ):
                await observer.until(lambda: state.snapshot().replicas[1].running
                                     + state.snapshot().replicas[1].waiting >= 1)
                busy = state.snapshot().replicas[1]
                assert "lora-a" in busy.adapters
            assert state.snapshot().replicas[0].running == 0
        finally:
            await scraper.stop()
            await client.aclose()


async def test_killed_simulated_replica_leaves_within_one_scrape_and_comes_back() -> None:
    async with SimFleet(replicas=2, profile="tiny") as sim:
        state, scraper, observer, client = await scraping_sim(sim)
        try:
            await observer.until(lambda: scraper.stats("sim0").scrapes >= 2)
            await sim.stop_replica(0)
            await observer.until(lambda: not state.snapshot().replicas[0].healthy)
            log = [(kind, what) for kind, name, what in observer.log if name == "sim0"]
            first_failure = next(i for i, e in enumerate(log) if e[0] == "scrape" and e[1] is not None)
            assert log[first_failure] == ("scrape", "connect")
            assert log[first_failure - 1] == ("change", FleetChange.HEALTH)
            assert state.snapshot().replicas[1].healthy

            await sim.restart_replica(0)
            await observer.until(lambda: state.snapshot().replicas[0].healthy)
        finally:
            await scraper.stop()
            await client.aclose()


async def test_simulated_replica_failing_health_is_ejected_until_it_recovers() -> None:
    fleet = FAST.model_copy(update={"health_interval_s": 0.05})
    async with SimFleet(replicas=2, profile="tiny") as sim:
        state, scraper, observer, client = await scraping_sim(sim, fleet)
        try:
            sim.replica(1).set_faults(health_status=503)
            await observer.until(lambda: not state.snapshot().replicas[1].healthy)
            assert state.snapshot().replicas[0].healthy
            sim.replica(1).set_faults(health_status=200)
            await observer.until(lambda: state.snapshot().replicas[1].healthy)
        finally:
            await scraper.stop()
            await client.aclose()
