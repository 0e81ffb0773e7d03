"""gateway/admission.py with the latency gate (`flow_control.predicted_admission`): requests wait
while the next one's predicted TTFT would be past the knee or an SLO, go on a first token, a
sheddable one is refused with a Retry-After from the predicted drain, a light tenant is held only
past `light_knee_factor` (its reserve above the heavy one's knee), and today's saturation thresholds
still cap. Real FleetState and LatencyEstimator
(the napkin prior: 25 ms per 1,000 uncached tokens), injected clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.admission import AdmissionQueue
from gateway.config import FleetConfig, FlowControlConfig, ReplicaConfig
from gateway.errors import GatewayError
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.state import FleetState
from gateway.latency_gate import LatencyGate
from gateway.metrics import GatewayMetrics
from policies.latency.estimator import LatencyEstimator, Prediction
from policies.latency_admission import LatencySlo
from policies.types import Band
from tests.gateway.stores.fakes import FakeClock

POOL = "m"
PROMPT = 1000  # tokens: 25.5 ms unloaded on the prior, ~54 ms with one more like it ahead


class Harness:
    """One replica "a"; requests dispatch as the proxy does: enter, then the ticket and the ledger."""

    def __init__(self, replicas: tuple[str, ...] = ("a",), **flow: Any) -> None:
        self.clock = FakeClock()
        flow.setdefault("saturation", {"max_in_flight_per_replica": 8, "max_waiting_per_replica": 8})
        flow.setdefault("predicted_admission", True)
        flow.setdefault("fair_share", {"reserve_per_replica": 0})
        self.fleet = FleetState(
            [ReplicaConfig(url=f"http://{name}:1", model=POOL, name=name) for name in replicas],
            FleetConfig(stale_after_s=1.0),
            self.clock,
        )
        self.est = LatencyEstimator(16)
        self.metrics = GatewayMetrics()
        self.adm = AdmissionQueue(
            FlowControlConfig.model_validate(flow), 1.0, self.fleet, self.metrics, self.clock, self.est
        )
        self.fleet.add_listener(self.adm.on_fleet_change)
        for name in replicas:
            self.fleet.record_scrape(name, ReplicaMetrics(running=0, waiting=0, kv_usage=0.1))
        self.started: list[str] = []
        self.tickets: list[tuple[str, str, str, Prediction]] = []  # label, tenant, replica, ticket
        self.ended: list[Prediction] = []  # prefilled by `first_token`, still running

    async def request(
        self,
        label: str,
        tenant: str = "t",
        band: Band = Band.STANDARD,
        prompt: int = PROMPT,
        slo: LatencySlo | None = None,
        on: str = "a",
        keys: tuple[int, ...] = (),
    ) -> str:
        """Enter, then dispatch to replica `on` (the test plays the router)."""
        path = await self.adm.enter(POOL, tenant, 1.0, band, prompt + 64, prompt, slo or LatencySlo(), keys)
        state = self.fleet.snapshot().by_name(on)
        assert state is not None
        if keys:  # the ticket joins the replica's KV ledger, as the proxy's does
            ticket = self.est.predict(state, prompt, self.clock(), 1.0, prompt_tokens=prompt,
                                      output_tokens=64, prefix_keys=keys)  # fmt: skip
        else:
            ticket = self.est.predict(state, prompt, self.clock(), 1.0)
        self.est.dispatched(ticket)
        self.fleet.dispatched(on, prompt + 64)
        self.started.append(label)
        self.tickets.append((label, tenant, on, ticket))
        return path

    def finish_oldest(self) -> None:
        """The oldest request got its first token and ended (its slot and tenant's share back)."""
        _, tenant, on, ticket = self.tickets.pop(0)
        self.est.prefilled(ticket)
        self.fleet.finished(on, ticket.uncached_tokens + 64)
        self.adm.leave(POOL, tenant)

    def first_token(self, label: str | None = None) -> None:
        """The request `label` (default: the oldest still prefilling) got its first token."""
        i = 0 if label is None else next(i for i, t in enumerate(self.tickets) if t[0] == label)
        ticket = self.tickets.pop(i)[3]
        self.est.prefilled(ticket)
        self.est.started(ticket, self.clock())
        self.ended.append(ticket)
        self.adm.on_prefilled(POOL)


async def settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_gate_holds_the_next_request_past_the_knee_and_a_first_token_releases_it() -> None:
    h = Harness()  # knee_factor 1.25 (the default), 8 slots: the counts alone would take 8
    assert await h.request("r1") == "direct"
    waiting = asyncio.ensure_future(h.request("r2"))
    await settle_loop()
    assert h.started == ["r1"] and h.adm.depth == 1
    h.first_token()  # r1's prefill is done: nothing ahead of r2 but the step under way
    await settle_loop()
    assert h.started == ["r1", "r2"] and waiting.result() == "queued"


async def test_a_short_prompt_is_not_held_for_the_decode_step_under_way() -> None:
    # A 300-token prompt's unloaded TTFT (~8 ms) is about one decode step. With r1 decoding and a
    # step just begun, the wait for it puts r2's predicted TTFT past the knee (1.5 x unloaded: the
    # tenant is alone), and when it ends the next step begins at once: holding r2 at kvgate could
    # not shorten that wait. The knee allows a decode step beyond the unloaded TTFT.
    short = 300
    h = Harness()
    assert await h.request("r1", prompt=short) == "direct"
    h.first_token()  # r1 decodes
    now = h.clock()
    h.est.step_seen("a", now)  # a decode step under way from now
    state = h.fleet.snapshot().by_name("a")
    assert state is not None
    unloaded, step = h.est.unloaded_ttft_s(state, short), h.est.ttft_and_step_s(state, short, now, 1.0)[1]
    assert 1.5 * unloaded < h.est.ttft_s(state, short, now, 1.0) <= unloaded + step  # the case
    assert await h.request("r2", prompt=short) == "direct"
    # A whole prompt's prefill ahead is still a queue: r3 waits for r2's first token.
    waiting = asyncio.ensure_future(h.request("r3", prompt=short))
    await settle_loop()
    assert h.started == ["r1", "r2"]
    h.first_token("r2")
    await settle_loop()
    assert h.started == ["r1", "r2", "r3"] and waiting.result() == "queued"


async def test_a_heavy_tenant_beside_a_light_one_is_held_without_the_step_floor() -> None:
    # Two tenants, 300-token prompts, a decode step just begun on the one replica. With A alone in
    # flight (u went quiet, so A is not alone in the window but nobody is outweighed) the knee
    # allows the step under way: A1 and A2 go. With B decoding one request beside A's three, B is
    # below its share and A above its own: A's knee loses the floor (its hold keeps room for B), A3 waits,
    # while B's next request, at the light knee with the floor, goes past it.
    short = 300
    h = Harness()
    assert await h.request("u0", tenant="u", prompt=short) == "direct"
    h.finish_oldest()
    assert await h.request("A0", tenant="A", prompt=short) == "direct"
    h.first_token()
    h.est.step_seen("a", h.clock())
    for label in ("A1", "A2"):
        assert await h.request(label, tenant="A", prompt=short) == "direct"
        h.first_token()
        h.est.step_seen("a", h.clock())
    assert await h.request("B0", tenant="B", prompt=short) == "direct"  # light: its own knee
    h.first_token()
    h.est.step_seen("a", h.clock())
    held = asyncio.ensure_future(h.request("A3", tenant="A", prompt=short))
    await settle_loop()
    assert h.started == ["u0", "A0", "A1", "A2", "B0"] and h.adm.depth == 1  # the heavy tenant waits
    b1 = asyncio.ensure_future(h.request("B1", tenant="B", prompt=short))
    await settle_loop()
    assert b1.done() and h.started[-1] == "B1" and not held.done()  # past A3, with no capacity event
    held.cancel()


async def test_off_it_is_todays_count_based_admission() -> None:
    h = Harness(predicted_admission=False)
    for i in range(8):
        assert await h.request(f"r{i}") == "direct"
    assert h.adm.depth == 0


async def test_a_larger_knee_factor_lets_more_through() -> None:
    h = Harness(knee_factor=4.0)
    for i in range(3):
        assert await h.request(f"r{i}") == "direct"
    waiting = asyncio.ensure_future(h.request("r3"))
    await settle_loop()
    assert h.started == ["r0", "r1", "r2"]
    waiting.cancel()


async def test_a_band_slo_tightens_the_knee_and_a_request_slo_tightens_further() -> None:
    # knee 10 would let ~9 through; the band's 60 ms lets 2 (25.5 ms unloaded, +25 ms each).
    h = Harness(knee_factor=10.0, bands={"standard": {"max_wait_s": 10.0, "ttft_slo_s": 0.06}})
    assert await h.request("r0") == "direct"
    assert await h.request("r1") == "direct"
    held = asyncio.ensure_future(h.request("r2"))
    await settle_loop()
    assert h.started == ["r0", "r1"]
    held.cancel()
    await settle_loop()
    # The same pool, the request's own 30 ms: nothing may be ahead of it any more.
    h2 = Harness(knee_factor=10.0, bands={"standard": {"max_wait_s": 10.0, "ttft_slo_s": 0.06}})
    assert await h2.request("r0", slo=LatencySlo(ttft_s=0.03)) == "direct"
    tight = asyncio.ensure_future(h2.request("r1", slo=LatencySlo(ttft_s=0.03)))
    await settle_loop()
    assert h2.started == ["r0"]
    tight.cancel()
    await settle_loop()
    # A request SLO looser than the band's changes nothing: the band's 60 ms lets 2 in.
    h3 = Harness(knee_factor=10.0, bands={"standard": {"max_wait_s": 10.0, "ttft_slo_s": 0.06}})
    loose = LatencySlo(ttft_s=5.0)
    assert await h3.request("r0", slo=loose) == "direct"
    assert await h3.request("r1", slo=loose) == "direct"
    held3 = asyncio.ensure_future(h3.request("r2", slo=loose))
    await settle_loop()
    assert h3.started == ["r0", "r1"]
    held3.cancel()


async def test_a_sheddable_request_is_refused_at_once_with_retry_after_from_the_predicted_drain() -> None:
    h = Harness()
    await h.request("big", prompt=100_000)  # 2.5 s of prefill ahead of anything that follows
    with pytest.raises(GatewayError) as err:
        await h.request("shed", band=Band.SHEDDABLE)
    assert err.value.status == 503
    # predicted ~2.53 s + the step under way, bound 1.25 x 25.5 ms: about 2.5 s to drain -> 3
    assert dict(err.value.headers)[b"retry-after"] == b"3"
    assert h.started == ["big"]


async def _flood(h: Harness) -> asyncio.Future[str]:
    """Tenant u was active a moment ago (so A is not alone) and A has a 200-token prompt prefilling:
    the next 1,000-token prompt is predicted at ~1.34 x unloaded, past knee_factor 1.25 and within
    light_knee_factor 1.5. A's next one waits."""
    assert await h.request("u0", tenant="u", prompt=200) == "direct"
    h.finish_oldest()
    assert await h.request("A0", tenant="A", prompt=200) == "direct"
    held = asyncio.ensure_future(h.request("A1", tenant="A"))
    await settle_loop()
    assert h.started == ["u0", "A0"] and h.adm.depth == 1  # the gate holds the heavy tenant at 1.25
    return held


async def test_a_light_tenant_is_dispatched_within_its_reserve_where_the_heavy_one_waits() -> None:
    h = Harness()
    held = await _flood(h)
    # B, below its share while A is above its own, arrives while A waits: the same 1,000 tokens at
    # ~1.34 x unloaded are within light_knee_factor 1.5, so B goes at once, ahead of A's queue.
    b = asyncio.ensure_future(h.request("B0", tenant="B"))
    await settle_loop()
    assert h.started == ["u0", "A0", "B0"] and h.adm.depth == 1 and b.done()
    held.cancel()


async def test_a_light_tenant_is_held_past_its_own_knee() -> None:
    h = Harness()
    held = await _flood(h)
    b = asyncio.ensure_future(h.request("B0", tenant="B"))
    await settle_loop()
    assert b.done()
    # With B's prompt also ahead, a light tenant C's request is past 1.5 x unloaded: C waits, and a
    # sheddable one is refused, where before the reserve a light tenant was never held.
    c = asyncio.ensure_future(h.request("C0", tenant="C"))
    await settle_loop()
    assert h.started == ["u0", "A0", "B0"] and not c.done()
    with pytest.raises(GatewayError) as err:
        await h.request("C-shed", tenant="C", band=Band.SHEDDABLE)
    assert err.value.status == 503
    # Held, not lost: the prefills ahead of it end (A0's, B0's, then A1's, which the fair queue
    # releases first: it came first), and C0 goes.
    for _ in range(3):
        h.first_token()
        await settle_loop()
    assert h.started == ["u0", "A0", "B0", "A1", "C0"] and c.result() == "queued"
    held.cancel()


async def _heavy_beside_light(h: Harness) -> None:
    """Two replicas. A has two 1,000-token requests decoding on b; u, light beside it, a 200-token
    prompt prefilling on a: there the next 1,000-token prompt is predicted at ~1.34 x unloaded,
    within light_knee_factor 1.5 but past knee_factor 1.25; b is within both."""
    for label in ("A0", "A1"):
        assert await h.request(label, tenant="A", on="b") == "direct"
        h.first_token(label)
    assert await h.request("u0", tenant="u", prompt=200, on="a") == "direct"


async def test_the_heavy_tenant_starts_a_prefill_while_another_replica_stays_within_the_light_knee() -> None:
    h = Harness(replicas=("a", "b"), light_reserve=1)
    await _heavy_beside_light(h)
    # A may take b: a stays within the light knee, the one request's room kept for u there.
    assert await h.request("A2", tenant="A", on="b") == "direct"
    held = asyncio.ensure_future(h.request("A3", tenant="A", on="b"))
    await settle_loop()
    assert h.started == ["A0", "A1", "u0", "A2"] and not held.done()
    # A2's prefill ends: b is free again, a still within the light knee. A3 is released to b.
    h.first_token("A2")
    await settle_loop()
    assert h.started[-1] == "A3" and held.result() == "queued"
    # u's next request goes at once (through the queue A's next waits in), to a, ahead of A4.
    a4 = asyncio.ensure_future(h.request("A4", tenant="A"))
    await settle_loop()
    u1 = asyncio.ensure_future(h.request("u1", tenant="u", on="a"))
    await settle_loop()
    assert h.started[-1] == "u1" and u1.done() and not a4.done()
    a4.cancel()


async def _a2_beside_a_whole_light_prompt(h: Harness) -> asyncio.Future[str]:
    """A's two requests decoding on b, u's whole 1,000-token prompt prefilling on a; then A2 enters
    for b. Returns A2's task once the loop has settled (done if it went, else waiting)."""
    for label in ("A0", "A1"):
        assert await h.request(label, tenant="A", on="b") == "direct"
        h.first_token(label)
    assert await h.request("u0", tenant="u", on="a") == "direct"
    task = asyncio.ensure_future(h.request("A2", tenant="A", on="b"))
    await settle_loop()
    return task


async def test_the_kept_room_is_measured_at_the_light_knee_and_holds_the_heavy_tenant_without_it() -> None:
    # The same, with u's prompt a whole one: a is past the light knee too, so b's room, the pool's
    # last at the light knee, is kept for u and A waits; without light_reserve, A takes it.
    for keep, a2 in ((1, False), (0, True)):
        h = Harness(replicas=("a", "b"), light_reserve=keep)
        task = await _a2_beside_a_whole_light_prompt(h)
        assert task.done() is a2, keep
        if not a2:
            # u0's prefill ends: a and b both within the light knee again, and A2 goes.
            h.first_token("u0")
            await settle_loop()
            assert task.result() == "queued"


async def test_on_one_replica_no_room_is_kept_and_only_while_a_light_tenant_uses_the_pool() -> None:
    # One replica: keeping its room would shut the heavy tenant out while the light one has anything
    # in flight, so light_reserve is capped at the pool's replicas less one (0 here).
    h = Harness(light_reserve=1)
    assert await h.request("u0", tenant="u") == "direct"
    h.first_token()
    assert await h.request("A0", tenant="A") == "direct"
    h.first_token()
    assert await h.request("A1", tenant="A") == "direct"
    h.first_token()
    assert await h.request("A2", tenant="A") == "direct"
    # Two replicas, u active only by the window (its request ended, nothing queued): no room is
    # kept for it, and A takes both replicas' room.
    w = Harness(replicas=("a", "b"), light_reserve=1)
    assert await w.request("u0", tenant="u", on="a") == "direct"
    w.finish_oldest()
    for label, on in (("A0", "a"), ("A1", "b")):
        assert await w.request(label, tenant="A", on=on) == "direct"
        w.first_token()
    assert await w.request("A2", tenant="A", on="a") == "direct"
    assert await w.request("A3", tenant="A", on="b") == "direct"


async def test_a_tenant_alone_is_held_to_the_solo_knee_and_two_tenants_to_the_knee() -> None:
    # 200 tokens (5.5 ms) ahead of a 1,000-token prompt (25.5 ms unloaded), with half a decode step
    # under way: ~34 ms predicted, 1.34 x unloaded. Over knee_factor 1.25, under solo_knee_factor 1.5.
    alone = Harness()
    assert await alone.request("small", prompt=200) == "direct"
    assert await alone.request("big") == "direct"
    # The same, while another tenant is active (seen within the fair-share window, holding nothing):
    # the fair queue has someone to choose between, and the knee is knee_factor.
    two = Harness()
    assert await two.request("u0", tenant="u", prompt=200) == "direct"
    two.finish_oldest()
    assert await two.request("small", prompt=200) == "direct"
    held = asyncio.ensure_future(two.request("big"))
    await settle_loop()
    assert two.started == ["u0", "small"] and two.adm.depth == 1
    held.cancel()
    # solo_knee_factor at knee_factor: one knee throughout, the tenant alone is held as well.
    one_knee = Harness(solo_knee_factor=1.25)
    assert await one_knee.request("small", prompt=200) == "direct"
    held = asyncio.ensure_future(one_knee.request("big"))
    await settle_loop()
    assert one_knee.started == ["small"]
    held.cancel()


async def test_the_saturation_thresholds_stay_hard_caps() -> None:
    # The gate would take 3 small requests; the in-flight cap of 2 still holds the third.
    h = Harness(knee_factor=50.0, saturation={"max_in_flight_per_replica": 2, "max_waiting_per_replica": 8})
    assert await h.request("r0", prompt=100) == "direct"
    assert await h.request("r1", prompt=100) == "direct"
    third = asyncio.ensure_future(h.request("r2", prompt=100))
    await settle_loop()
    assert h.started == ["r0", "r1"]
    third.cancel()


async def test_the_gate_holds_a_request_whose_kv_blocks_are_not_free_and_an_end_releases_it() -> None:
    # 100 blocks of 16 tokens: a 1,000-token prompt takes 63 blocks, 67 with its 64 output tokens.
    h = Harness()
    kv = ReplicaMetrics(running=0, waiting=0, kv_usage=0.1, block_size=16, num_gpu_blocks=100)
    h.fleet.record_scrape("a", kv)
    first = tuple(range(62))
    assert await h.request("r1", keys=first) == "direct"
    h.first_token()  # prefilled and running: no prefill ahead of the next, but its blocks held
    # The same prompt shares r1's prefix blocks: it fits beside it and goes.
    assert await h.request("r1b", keys=first) == "direct"
    h.first_token()
    # Another prompt needs 63 blocks of its own: none free until r1 ends, so it waits at kvgate.
    waiting = asyncio.ensure_future(h.request("r2", keys=tuple(range(100, 162))))
    await settle_loop()
    assert h.started == ["r1", "r1b"] and h.adm.depth == 1
    # The same load without a KV ledger (the tickets hold no blocks) lets it go.
    plain = Harness()
    plain.fleet.record_scrape("a", kv)
    assert await plain.request("p1") == "direct"
    plain.first_token()
    assert await plain.request("p2") == "direct"
    # r1 and r1b end: their blocks are free and their tenant's slots come back; r2 goes.
    for ticket in h.ended:
        h.est.ended(ticket)
        h.fleet.finished("a", ticket.uncached_tokens + 64)
        h.adm.leave(POOL, "t")
    await settle_loop()
    assert h.started[-1] == "r2" and waiting.result() == "queued"


async def test_a_release_prices_its_head_at_the_light_knee_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The state of the test above with the kept room: A2 waits because b's room at the light knee is
    # kept for u. A release then prices A2 at the knee, then at the light knee for the kept room;
    # the light tenants' room it falls back to is that same price, not a second pass over the pool.
    h = Harness(replicas=("a", "b"), light_reserve=1)
    task = await _a2_beside_a_whole_light_prompt(h)
    assert not task.done()
    priced: list[bool] = []
    room = LatencyGate.room

    def counting(self: LatencyGate, *args: Any, **kwargs: Any) -> tuple[int, float]:
        priced.append(bool(args[4]) if len(args) > 4 else bool(kwargs.get("light", False)))
        return room(self, *args, **kwargs)

    monkeypatch.setattr(LatencyGate, "room", counting)
    h.adm.on_prefilled(POOL)  # a release with nothing changed: A2 still waits
    await settle_loop()
    assert not task.done()
    assert priced == [False, True]  # the knee, then the light knee: once each
    task.cancel()
