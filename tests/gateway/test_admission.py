"""gateway/admission.py over a real FleetState (injected clock): when requests start, wait, leave,
or are refused, in which order they are released, and that a release is counted at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.admission import AdmissionQueue, Held
from gateway.config import FleetConfig, FlowControlConfig, ReplicaConfig
from gateway.errors import GatewayError
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.state import FleetState
from gateway.metrics import GatewayMetrics
from policies.latency_admission import NO_SLO
from policies.types import Band
from tests.gateway.stores.fakes import FakeClock

POOL = "m"


class Harness:
    """One pool of replicas "a" (and "b"), an AdmissionQueue listening to it, and requests that
    dispatch the way the proxy does (synchronously, right after `enter` returns)."""

    def __init__(self, replicas: int = 1, **flow: Any) -> None:
        self.clock = FakeClock()
        flow.setdefault("saturation", {"max_in_flight_per_replica": 2, "max_waiting_per_replica": 4})
        self.names = ["a", "b"][:replicas]
        self.fleet = FleetState(
            [ReplicaConfig(url=f"http://{n}:1", model=POOL, name=n) for n in self.names],
            FleetConfig(stale_after_s=1.0),
            self.clock,
        )
        self.metrics = GatewayMetrics()
        self.adm = AdmissionQueue(
            FlowControlConfig.model_validate(flow), 1.0, self.fleet, self.metrics, self.clock
        )
        self.fleet.add_listener(self.adm.on_fleet_change)
        self.started: list[str] = []
        self.running: dict[str, list[str]] = {}  # replica -> tenants of its requests, oldest first
        for n in self.names:
            self.scrape(n)

    def scrape(self, replica: str = "a", waiting: int = 0, kv: float = 0.1) -> None:
        self.fleet.record_scrape(replica, ReplicaMetrics(running=0, waiting=waiting, kv_usage=kv))

    async def request(
        self, label: str, tenant: str = "t", band: Band = Band.STANDARD, cost: int = 100, weight: float = 1.0
    ) -> str:
        path = await self.adm.enter(POOL, tenant, weight, band, cost)
        replica = self.names[len(self.started) % len(self.names)]
        self.fleet.dispatched(replica, 1)
        self.running.setdefault(replica, []).append(tenant)
        self.started.append(label)
        return path

    def finish(self, replica: str = "a") -> None:
        """The oldest request on `replica` ends: the forwarder's release, then the tenant's settle."""
        self.fleet.finished(replica, 1)
        running = self.running.get(replica)
        if running:
            self.adm.leave(POOL, running.pop(0))

    def spawn(self, coro: Awaitable[str]) -> asyncio.Task[str]:
        return asyncio.ensure_future(coro)


async def settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_starts_directly_while_there_is_room_then_queues_and_releases_on_completions() -> None:
    h = Harness()
    assert await h.request("r1") == "direct"
    assert await h.request("r2") == "direct"
    waiting = [h.spawn(h.request(f"q{i}")) for i in range(3)]
    await settle_loop()
    assert h.started == ["r1", "r2"] and h.adm.depth == 3
    h.finish()
    await settle_loop()
    assert h.started == ["r1", "r2", "q0"]
    h.finish()
    h.finish()
    await settle_loop()
    assert h.started == ["r1", "r2", "q0", "q1", "q2"]
    assert [t.result() for t in waiting] == ["queued"] * 3 and h.adm.depth == 0


async def test_strict_priority_between_bands_and_fifo_inside_a_tenant() -> None:
    h = Harness()
    await h.request("r1")
    await h.request("r2")
    tasks = [h.spawn(h.request("std1")), h.spawn(h.request("std2"))]
    await settle_loop()
    tasks.append(h.spawn(h.request("crit", band=Band.CRITICAL)))
    await settle_loop()
    for _ in range(3):
        h.finish()
        await settle_loop()
    assert h.started[2:] == ["crit", "std1", "std2"]
    await asyncio.gather(*tasks)


async def test_fair_shares_by_tokens_and_weight_inside_a_band() -> None:
    h = Harness(saturation={"max_in_flight_per_replica": 1, "max_waiting_per_replica": 4})
    await h.request("first", tenant="x")
    tasks = [h.spawn(h.request(f"A{i}", tenant="A", cost=100)) for i in range(6)]
    await settle_loop()
    # B arrives later with cheap requests and twice the weight: it is not stuck behind A's backlog
    tasks += [h.spawn(h.request(f"B{i}", tenant="B", cost=100, weight=2.0)) for i in range(4)]
    await settle_loop()
    for _ in range(10):
        h.finish()
        await settle_loop()
    order = h.started[1:]
    assert order[:6] == ["A0", "B0", "B1", "A1", "B2", "B3"], order
    await asyncio.gather(*tasks)


async def test_a_band_with_no_wait_is_refused_at_once_while_saturated() -> None:
    h = Harness()
    assert await h.request("shed-ok", band=Band.SHEDDABLE) == "direct"
    await h.request("r2")
    with pytest.raises(GatewayError) as err:
        await h.request("shed", band=Band.SHEDDABLE)
    e = err.value
    assert e.status == 503 and e.message.startswith("fleet overloaded")
    assert dict(e.headers)[b"retry-after"].isdigit()
    assert h.adm.depth == 0


async def test_a_request_that_cannot_start_in_time_gets_503_and_leaves_the_queue() -> None:
    h = Harness(bands={"standard": {"max_wait_s": 0.05}})
    await h.request("r1")
    await h.request("r2")
    with pytest.raises(GatewayError) as err:
        async with asyncio.timeout(5):
            await h.request("late")
    assert err.value.status == 503 and b"retry-after" in dict(err.value.headers)
    assert h.adm.depth == 0 and h.adm.depth_of("t") == 0
    h.finish()  # the freed slot is not given to the gone request
    assert await h.request("next") == "direct"


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    h = Harness()
    await h.request("r1")
    await h.request("r2")
    gone = h.spawn(h.request("gone"))
    stays = h.spawn(h.request("stays"))
    await settle_loop()
    gone.cancel()
    await settle_loop()
    assert gone.cancelled() and h.adm.depth == 1
    h.finish()
    await settle_loop()
    assert h.started == ["r1", "r2", "stays"] and stays.done()


async def test_released_then_cancelled_passes_its_slot_on() -> None:
    h = Harness()
    await h.request("r1")
    await h.request("r2")
    first = h.spawn(h.request("first"))
    second = h.spawn(h.request("second"))
    await settle_loop()
    h.finish()  # releases `first`; before its task runs, its client goes away
    first.cancel()
    await settle_loop()
    assert first.cancelled()
    assert h.started == ["r1", "r2", "second"] and second.done()


async def test_queue_limits_global_and_per_tenant() -> None:
    h = Harness(max_queue=3, max_queue_per_tenant=2)
    await h.request("r1")
    await h.request("r2")
    tasks = [h.spawn(h.request("a1", tenant="A")), h.spawn(h.request("a2", tenant="A"))]
    await settle_loop()
    with pytest.raises(GatewayError) as err:
        await h.request("a3", tenant="A")
    assert err.value.status == 429 and err.value.code == "queue_limit_exceeded"
    tasks.append(h.spawn(h.request("b1", tenant="B")))
    await settle_loop()
    with pytest.raises(GatewayError) as err:
        await h.request("c1", tenant="C")
    assert err.value.status == 503
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert h.adm.depth == 0


async def test_stale_metrics_hold_requests_until_a_fresh_scrape() -> None:
    h = Harness()
    h.clock.now += 5  # the last scrape is now stale: the replica counts as saturated
    task = h.spawn(h.request("held"))
    await settle_loop()
    assert not task.done()
    h.scrape()
    await settle_loop()
    assert task.result() == "queued"


async def test_requests_sent_since_the_scrape_count_against_the_engine_queue() -> None:
    h = Harness(saturation={"max_in_flight_per_replica": 100, "max_waiting_per_replica": 4})
    h.scrape(waiting=3)  # room for 4 + 1 - 3 = 2 more until the next scrape
    assert await h.request("r1") == "direct"
    assert await h.request("r2") == "direct"
    held = h.spawn(h.request("held"))
    await settle_loop()
    assert not held.done()  # the stale `waiting=3` alone would have let it through
    h.scrape(waiting=1)  # the replica caught up
    await settle_loop()
    assert held.result() == "queued"


async def test_one_capacity_event_releases_no_more_than_the_room() -> None:
    h = Harness(saturation={"max_in_flight_per_replica": 3, "max_waiting_per_replica": 10})
    for i in range(3):
        await h.request(f"r{i}")
    tasks = [h.spawn(h.request(f"q{i}")) for i in range(10)]
    await settle_loop()
    for _ in range(3):  # three completions in one go, before any released task has run
        h.finish()
    h.scrape()  # and a fresh scrape on top: still only three slots
    await settle_loop()
    assert len(h.started) == 6
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_pool_with_no_healthy_replica_is_not_held() -> None:
    h = Harness()
    h.fleet.report_failure("a", "connect")  # ejected: routing will answer 503 at once
    assert await h.request("r1") == "direct"


async def test_retry_after_follows_the_observed_drain_rate() -> None:
    h = Harness(saturation={"max_in_flight_per_replica": 1, "max_waiting_per_replica": 0})
    await h.request("r0")
    for _ in range(40):  # 40 completions over 10 s: ~4 per second
        h.clock.now += 0.25
        h.scrape()
        h.finish()
        await h.request("r")
    tasks = [h.spawn(h.request(f"q{i}")) for i in range(19)]
    await settle_loop()
    with pytest.raises(GatewayError) as err:
        await h.request("shed", band=Band.SHEDDABLE)
    # 19 queued ahead of it plus itself, drained at ~4 per second: about 5 s
    retry = int(dict(err.value.headers)[b"retry-after"])
    assert 4 <= retry <= 8, retry
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_metrics_families() -> None:
    h = Harness()
    names = {m.name for m in h.adm.collect()}
    assert names == {"kvgate_queue_depth"}


# --- the fair-share reserve ----------------------------------------------------------------------

RESERVE_POOL = {"max_in_flight_per_replica": 4, "max_waiting_per_replica": 10}  # 2 replicas: 8 slots
ONE_EACH = {"reserve_per_replica": 1}  # 2 slots of the 8 reserved


async def flood(h: Harness, tenant: str, n: int) -> list[asyncio.Task[str]]:
    tasks = [h.spawn(h.request(f"{tenant}{i}", tenant=tenant)) for i in range(n)]
    await settle_loop()
    return tasks


async def test_a_tenant_alone_fills_the_whole_pool_reserve_included() -> None:
    h = Harness(replicas=2, saturation=RESERVE_POOL, fair_share=ONE_EACH)
    tasks = await flood(h, "heavy", 10)
    assert len(h.started) == 8 and h.adm.depth == 2  # the reserve (1 per replica) is no limit alone
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_light_tenant_starts_at_once_beside_a_flood() -> None:
    h = Harness(replicas=2, saturation=RESERVE_POOL, fair_share=ONE_EACH)
    await h.request("light-early", tenant="light")  # the light tenant is active
    h.finish("a")
    tasks = await flood(h, "heavy", 12)
    # heavy is above its share (8 / 2) once it holds 6: the last 2 slots stay free for light
    assert h.started.count("heavy0") == 1 and len(h.started) == 1 + 6 and h.adm.depth == 6
    # Light's requests start at once (released as they join the queue), no slot has to free first.
    await asyncio.wait_for(h.request("light-1", tenant="light"), 1.0)
    await asyncio.wait_for(h.request("light-2", tenant="light"), 1.0)
    assert h.started[-2:] == ["light-1", "light-2"] and h.adm.depth == 6
    # A heavy request ends: heavy is still above its share, and the reserve is kept free again.
    h.finish("a")
    await settle_loop()
    assert h.started[-1] == "light-2"
    h.finish("b")
    h.finish("a")  # room beyond the reserve: it goes in the queue's order, heavy's next
    await settle_loop()
    assert h.started[-2:] == ["light-2", "heavy6"] and h.adm.depth == 5
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_reserve_returns_to_the_heavy_tenant_when_the_light_one_goes_quiet() -> None:
    h = Harness(replicas=2, saturation=RESERVE_POOL, fair_share={**ONE_EACH, "active_window_s": 5.0})
    await h.request("light", tenant="light")
    h.finish("a")
    tasks = await flood(h, "heavy", 12)
    assert len(h.started) == 7
    h.clock.now += 6.0  # light's window has passed
    h.scrape("a")
    h.scrape("b")
    await settle_loop()
    assert len(h.started) == 9 and h.started[-2:] == ["heavy6", "heavy7"]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_light_request_queued_behind_the_flood_takes_a_reserved_slot() -> None:
    h = Harness(
        replicas=2,
        saturation={"max_in_flight_per_replica": 2, "max_waiting_per_replica": 10},
        fair_share=ONE_EACH,
    )
    tasks = await flood(h, "heavy", 6)  # alone: all 4 slots, 2 waiting
    light = h.spawn(h.request("light", tenant="light"))  # queued: the pool is full
    await settle_loop()
    assert "light" not in h.started
    h.finish("a")  # one slot frees: light is below its share, heavy is not
    await settle_loop()
    assert h.started[-1] == "light"
    assert await light == "queued"
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_reserve_zero_is_plain_work_conserving_fair_queuing() -> None:
    h = Harness(replicas=2, saturation=RESERVE_POOL, fair_share={"reserve_per_replica": 0})
    await h.request("light-early", tenant="light")
    h.finish("a")
    tasks = await flood(h, "heavy", 12)
    assert len(h.started) == 1 + 8  # heavy takes every slot
    light = h.spawn(h.request("light-1", tenant="light"))
    await settle_loop()
    assert h.started[-1] != "light-1"  # it waits for a slot to free: two, as it happens, since
    h.finish("b")  # heavy's queued requests and light's start level (heavy's direct starts were
    await settle_loop()  # not charged in the queue), and heavy's came first
    assert h.started[-1] == "heavy8"
    h.finish("a")
    await settle_loop()
    assert h.started[-1] == "light-1"
    for t in [*tasks, light]:
        t.cancel()
    await asyncio.gather(*tasks, light, return_exceptions=True)


async def test_the_reserve_is_at_most_half_a_replicas_slots() -> None:
    # 2 slots per replica and reserve_per_replica 2: capped to 1 of the 2.
    h = Harness(saturation={"max_in_flight_per_replica": 2, "max_waiting_per_replica": 10})
    await h.request("light", tenant="light")
    h.finish("a")
    tasks = await flood(h, "heavy", 3)
    assert h.started == ["light", "heavy0"]  # heavy holds 1 of 2: its share; the other is reserved
    assert await asyncio.wait_for(h.request("light-2", tenant="light"), 1.0) == "queued"
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_critical_requests_are_not_held_back_by_the_reserve() -> None:
    h = Harness(replicas=2, saturation=RESERVE_POOL, fair_share=ONE_EACH)
    await h.request("light", tenant="light")
    h.finish("a")
    tasks = await flood(h, "heavy", 6)
    assert len(h.started) == 7  # heavy stopped at its share: 2 slots reserved
    # Heavy's critical request takes a reserved slot at once, above its share.
    assert await asyncio.wait_for(h.request("crit", tenant="heavy", band=Band.CRITICAL), 1.0) == "direct"
    # And one queued behind a full pool goes first when a slot frees, reserve or not.
    await h.request("light-2", tenant="light")
    crit = h.spawn(h.request("crit-2", tenant="heavy", band=Band.CRITICAL))
    await settle_loop()
    assert "crit-2" not in h.started
    h.finish("b")
    await settle_loop()
    assert h.started[-1] == "crit-2"
    for t in [*tasks, crit]:
        t.cancel()
    await asyncio.gather(*tasks, crit, return_exceptions=True)


def test_admit_may_release_the_request_before_it_returns() -> None:
    # `admit` pushes, then drains: a request that goes ahead of the queue (here a critical one, with
    # a slot free that no capacity event has announced) is woken inside the call. A caller must be
    # ready for that wake before `admit` returns (the discrete-event mode once was not).
    h = Harness()
    for _ in range(2):  # r1, r2: the replica's two slots
        assert h.adm.admit(POOL, "t", 1.0, Band.STANDARD, 100, 0, NO_SLO, (), lambda _e: True) is None
        h.fleet.dispatched("a", 1)
    woken: list[tuple[str, bool, object]] = []
    held: dict[str, Held | None] = {}

    def wake(label: str) -> Callable[[GatewayError | None], bool]:
        def call(err: GatewayError | None) -> bool:
            woken.append((label, label in held, err))
            return True

        return call

    held["std"] = h.adm.admit(POOL, "t", 1.0, Band.STANDARD, 100, 0, NO_SLO, (), wake("std"))
    assert held["std"] is not None and woken == [] and h.adm.depth == 1
    h.fleet.remove_listener(h.adm.on_fleet_change)
    h.fleet.finished("a", 1)  # a slot frees unannounced
    held["crit"] = h.adm.admit(POOL, "u", 1.0, Band.CRITICAL, 100, 0, NO_SLO, (), wake("crit"))
    assert woken == [("crit", False, None)]  # woken inside `admit`, before it returned
    crit = held["crit"]
    assert crit is not None and h.adm.depth == 1  # std still waits: one slot
    h.adm.end_wait(crit, True, "dispatched")
    h.fleet.dispatched("a", 1)
    assert h.adm.depth_in(POOL) == 1 and h.adm.in_flight_of("u") == 1
