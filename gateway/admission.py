"""Flow control: let a request start now, hold it in the fair queue while its pool is saturated, or
refuse it (503 `fleet overloaded`, or 429 for a tenant's own queue limit) with a Retry-After
(gateway/admission_refusal.py).

Per POOL (the request's base model, gateway/admission_pools.py): a `FairQueue` (strict priority
between bands, weighted fair shares of tokens between tenants inside a band, FIFO inside a tenant),
a drain-rate estimate for Retry-After, and a count of requests released from the queue but not yet
dispatched. Its room, the requests it can take now (its replicas' saturation, less what kvgate sent
them since their last scrape and what was released but not yet dispatched), is counted there; a pool
with no healthy replica is down, not saturated: requests are not held for it (routing answers 503 at
once instead of after a queue timeout).

Fair-share reserve (policies/fair_share). The pool's last `reserve_per_replica` (at most half of
`max_in_flight_per_replica`) x healthy replicas of room go only to tenants below their fair share of
the pool's requests in flight: the queue's next item among those tenants, while the others wait. So
a tenant flooding the pool cannot take every slot, and a lighter tenant's request starts the moment
it arrives instead of waiting for a slot to free. With one active tenant the reserve is no
constraint, and `critical` requests are never held back by it (priority between bands stays strict).

A request starts at once when its pool's queue is empty and there is room (beyond the reserve, or
inside it for a tenant below its share). Otherwise it waits in the queue (its band's `max_wait_s`;
a band with 0, `sheddable` by default, is refused at once) until a capacity event releases it: a
replica's fresh scrape, a finished request (FleetChange.RELEASED), a health change. A waiter that
is cancelled (the client left) leaves the queue; if it had just been released, its slot is passed on
to the next waiter.

Predicted latency (`flow_control.predicted_admission`, gateway/latency_gate.py): room is also what
the latency model says, the next request's predicted TTFT on a replica within the knee x its
unloaded TTFT there (at least that + a decode step of the batch running there) or the tightest TTFT
SLO (`knee_factor`; `solo_knee_factor` while the pool has at most one active tenant). Held requests
wait in the fair queue (a sheddable one: refused, Retry-After from the predicted drain); a first
token (`on_prefilled`) is a capacity event; a tenant below its fair share while another is above it
is held at `light_knee_factor` instead, and the heavy one leaves `light_reserve` requests' worth of
room at the light knee to it: a latency reserve the heavy tenant cannot use (sized, in the queue, by
the queue's head as the gate's room is), so a light tenant's request finds a replica with at most a
light knee's worth of work ahead of it (the `latency-knee` routing filter sends it there) instead of
waiting behind a whole prefill.

Single event loop; nothing here blocks. Listeners and `enter` never call back into FleetState writers.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.admission_pools import DOWN, AdmissionPools, Pool, Waiter
from gateway.admission_refusal import Reason, refusal
from gateway.config import FlowControlConfig
from gateway.drain import shutting_down
from gateway.errors import GatewayError
from gateway.fleet.state import FleetChange, FleetState
from gateway.latency_gate import LatencyGate
from gateway.metrics import GatewayMetrics
from policies.fair_queue import QueueItem
from policies.latency.estimator import LatencyEstimator
from policies.latency_admission import NO_SLO, LatencySlo
from policies.types import Band

Path = Literal["direct", "queued"]
Outcome = Literal["dispatched", "timeout", "cancelled"]
_DEFAULT_MAX_WAIT = {Band.CRITICAL: 30.0, Band.STANDARD: 10.0, Band.SHEDDABLE: 0.0}


def _max_waits(cfg: FlowControlConfig) -> dict[Band, float]:
    out = dict(_DEFAULT_MAX_WAIT)
    for name, band in cfg.bands.items():
        out[Band.parse(name)] = band.max_wait_s
    return out


def _released(fut: asyncio.Future[None]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _wake(fut: asyncio.Future[None], refused: GatewayError | None) -> bool:
    if fut.done():
        return False
    if refused is None:
        fut.set_result(None)
    else:
        fut.set_exception(refused)
    return True


@dataclass(frozen=True, slots=True)
class Held:
    """A request waiting in `pool`'s queue (`AdmissionQueue.admit`): since `since`, for at most
    `max_wait_s` (its band's)."""

    pool: Pool
    item_id: str
    tenant: str
    band: Band
    since: float
    max_wait_s: float


class AdmissionQueue:
    """Flow control over one FleetState. Call `enter` per request (after rate limits), and
    `on_fleet_change` from the fleet listener."""

    def __init__(
        self,
        cfg: FlowControlConfig,
        stale_after_s: float,
        fleet: FleetState,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        latency: LatencyEstimator | None = None,
    ) -> None:
        self._cfg = cfg
        self._max_wait = _max_waits(cfg)
        self._m = metrics
        self._clock = clock
        self._pools = AdmissionPools(cfg, stale_after_s, fleet, clock)
        self._gate = LatencyGate(cfg, latency, self._pools)
        self._depth = 0
        self._ids = itertools.count()
        self._closed = False

    # -- the request path -----------------------------------------------------------------------

    async def enter(
        self,
        pool: str,
        tenant: str,
        weight: float,
        band: Band,
        cost_tokens: int,
        prompt_tokens: int = 0,
        slo: LatencySlo = NO_SLO,
        prefix_keys: tuple[int, ...] = (),
    ) -> Path:
        """Return when the request may be dispatched ("direct" or after waiting, "queued").
        `prompt_tokens` and `slo` (the tenant's and the request's; the band's is added here) are what
        the latency gate judges by.

        The caller must dispatch without awaiting anything else first (the release is counted as
        `pending` only until this returns). Raises GatewayError 503 (shed, queue full, timeout) or
        429 (the tenant's queue limit), each with Retry-After. Cancellation-safe: a cancelled waiter
        leaves the queue.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held = self.admit(
            pool, tenant, weight, band, cost_tokens, prompt_tokens, slo, prefix_keys, partial(_wake, fut)
        )
        if held is None:
            return "direct"
        outcome: Outcome = "cancelled"
        try:
            try:
                async with asyncio.timeout(held.max_wait_s):
                    await fut
            except TimeoutError:
                if not _released(fut):
                    outcome = "timeout"
                    raise self.timed_out(held) from None
            outcome = "dispatched"
            return "queued"
        finally:
            self.end_wait(held, _released(fut), outcome)
            fut.cancel()

    def admit(
        self,
        pool: str,
        tenant: str,
        weight: float,
        band: Band,
        cost_tokens: int,
        prompt_tokens: int,
        slo: LatencySlo,
        prefix_keys: tuple[int, ...],
        wake: Callable[[GatewayError | None], bool],
    ) -> Held | None:
        """`enter`'s decision without the wait: None when the request may be dispatched now, else
        its place in the queue (`Held`). `wake(None)` is called once it may go, `wake(error)` when it
        is refused while waiting (shutdown); `wake` returns False when its waiter has already left
        (a release then passes on). The caller ends the wait with `end_wait` (after `timed_out` when
        its `max_wait_s` passed first). Raises as `enter` does. The discrete-event mode drives this
        in virtual time (loadtests/des/simulation.py)."""
        self._pools.sync()
        p = self._pools.get(pool)
        if p is None:
            return None  # not a pool of this fleet: routing will answer
        now = self._clock()
        slo = self._gate.slo(band, slo)
        gated = self._gate.on
        drain_s: float | None = None  # the gate held it: the predicted drain, for Retry-After
        if not p.queue or (gated and self._max_wait[band] <= 0):
            reserve = self._pools.reserve(p)
            room = self._pools.room(p, now, reserve + 1)
            if room > reserve or (
                room > 0
                and (band is Band.CRITICAL or p.share.below_share(tenant, room, now, p.queue.depth_of))
            ):
                if not gated:  # (the queue is empty)
                    p.share.started(tenant, weight, now)
                    return None
                fits, drain = self._gate.room(p, now, prompt_tokens, slo, False, prefix_keys)
                light = p.share.outweighed(max(fits, 0), now, p.queue.depth_of)
                if light(tenant):  # ahead of the queue, up to its own knee, the kept room its own
                    if fits <= 0:
                        fits, drain = self._gate.room(p, now, prompt_tokens, slo, True, prefix_keys)
                    go = fits > 0
                else:
                    heavy = self._gate.heavy_room(p, now, fits, prompt_tokens, slo, prefix_keys)[0]
                    go = not p.queue and heavy > 0
                if go:
                    p.share.started(tenant, weight, now)
                    return None
                if fits <= 0:
                    drain_s = drain
        max_wait = self._max_wait[band]
        if max_wait <= 0:
            raise self._refuse(p, band, tenant, now, "shed", drain_s)
        if self._closed:
            raise shutting_down()
        if self._depth >= self._cfg.max_queue:
            raise self._refuse(p, band, tenant, now, "queue_full")
        if self.depth_of(tenant) >= self._cfg.max_queue_per_tenant:
            raise self._refuse(p, band, tenant, now, "tenant_queue_full")
        p.share.seen(tenant, weight, now)
        item_id = str(next(self._ids))
        # Deadlines are kept by each waiter's own timeout, not by the queue (deadline = inf).
        waiter = Waiter(wake, max(0, prompt_tokens), slo, prefix_keys)
        p.queue.push(QueueItem(item_id, tenant, band, weight, max(0, cost_tokens), now, math.inf, waiter))
        self._depth += 1
        self._drain(p, now)  # a more important request may go ahead of what waits, if there is room
        return Held(p, item_id, tenant, band, now, max_wait)

    def timed_out(self, held: Held) -> GatewayError:
        """The answer to a request `held` whose `max_wait_s` passed before it was released (503,
        Retry-After); counted. The caller still ends the wait (`end_wait`, outcome "timeout")."""
        return self._refuse(held.pool, held.band, held.tenant, self._clock(), "queue_timeout")

    def end_wait(self, held: Held, released: bool, outcome: Outcome) -> None:
        """The wait of `held` is over: dispatched after its release, or it left (timed out, client
        gone). A released request that is not dispatched passes its slot on; one never released
        leaves the queue."""
        p = held.pool
        if released:
            p.pending -= 1
            if outcome != "dispatched":  # released, but the client left: pass the slot on
                now = self._clock()
                p.share.ended(held.tenant, now)
                self._drain(p, now)
        elif p.queue.remove(held.item_id) is not None:
            self._depth -= 1
        self._m.queue_wait.labels(held.tenant, held.band.label, outcome).observe(self._clock() - held.since)

    def leave(self, pool: str, tenant: str) -> None:
        """A request `enter` let through has ended (settled): its slot counts for its tenant no more."""
        p = self._pools.get(pool)
        if p is None:
            return
        now = self._clock()
        p.share.ended(tenant, now)
        if p.queue:
            self._drain(p, now)

    def has_spare_room(self, pool: str) -> bool:
        """Whether `pool` could take one more request now that no one waits for: its queue is empty
        and it has room beyond the fair-share reserve. Extra work that must never be queued ahead of
        real traffic (shadow copies) asks this and is dropped when the answer is no."""
        p = self._pools.get(pool)
        if p is None or p.queue:
            return False
        reserve = self._pools.reserve(p)
        return reserve < self._pools.room(p, self._clock(), reserve + 1) < DOWN

    def in_flight_of(self, tenant: str) -> int:
        """Requests of `tenant` let through and not yet `leave`-d, all pools together."""
        return sum(p.share.in_flight_of(tenant) for p in self._pools)

    def depth_of(self, tenant: str) -> int:
        """Requests of `tenant` waiting, all pools together."""
        return sum(p.queue.depth_of(tenant) for p in self._pools)

    @property
    def depth(self) -> int:
        return self._depth

    def depth_in(self, pool: str) -> int:
        """Requests of `pool` waiting here (goodput headroom counts them as load, pool_headroom.py)."""
        p = self._pools.get(pool)
        return 0 if p is None else len(p.queue)

    # -- capacity events ------------------------------------------------------------------------

    def on_fleet_change(self, replica: str, change: FleetChange) -> None:
        before = self._pools.of_replica(replica)  # a replica that left or moved frees its old pool
        self._pools.sync()
        p = self._pools.of_replica(replica)
        now = self._clock()
        if p is not None:
            if FleetChange.RELEASED in change:
                p.drain.observe(now)
            if FleetChange.METRICS in change:
                self._pools.scraped(replica)
            if p.queue:
                # A finished request is released here before its tenant's `leave`, which follows at
                # once: the reserved room waits for it, so the shares it is given to are up to date.
                self._drain(p, now, reserve_too=FleetChange.RELEASED not in change)
        if before is not None and before is not p and before.queue:
            self._drain(before, now)

    def on_prefilled(self, pool: str) -> None:
        """A request of `pool` got its first token: with the latency gate on, the work ahead of the
        next one shrank, so waiters may go."""
        p = self._pools.get(pool)
        if p is not None and p.queue and self._gate.on:
            self._drain(p, self._clock())

    def close(self) -> None:
        """Refuse everything waiting, and all that would wait from now on: 503 with Retry-After and
        Connection: close (the end of a drain's propagation window, and shutdown). Idempotent."""
        self._closed = True
        for p in self._pools:
            while (item := p.queue.pop()) is not None:
                if item.payload.wake(shutting_down()):
                    self._m.rejections.labels(item.tenant, "draining").inc()
        self._depth = 0

    def reconfigure(self, cfg: FlowControlConfig) -> None:
        """Take a reloaded `flow_control` section (not `enabled`: that needs a restart). Waiters keep
        their place and the deadline they started with; the new room may release some at once."""
        self._cfg = cfg
        self._max_wait = _max_waits(cfg)
        self._gate.reconfigure(cfg)
        self._pools.reconfigure(cfg)
        now = self._clock()
        for p in self._pools:
            if p.queue:
                self._drain(p, now)

    # -- internals ------------------------------------------------------------------------------

    def _drain(self, p: Pool, now: float, reserve_too: bool = True) -> None:
        """Release waiters while there is room: in the queue's order above the reserve, then (if
        `reserve_too`) the queue's next among the tenants below their share."""
        q, share = p.queue, p.share
        reserve = self._pools.reserve(p)
        room = self._pools.room(p, now, len(q) + reserve)
        if not reserve_too:
            room -= reserve
            reserve = 0
        fits = 1 << 30  # requests the latency gate lets through (sized by the queue's head)
        light: Callable[[str], bool] | None = None
        if room > 0 and self._gate.on and (first := q.peek()) is not None:
            w = first.payload
            tokens, slo, keys = w.prompt_tokens, w.slo, w.prefix_keys
            fits = self._gate.room(p, now, tokens, slo, False, keys)[0]
            fits, light_fits = self._gate.heavy_room(p, now, fits, tokens, slo, keys)
            if fits <= 0:
                light = share.outweighed(0, now, q.depth_of)
                # The head's room at the light knee: priced already for the kept room, if it was.
                fits = self._gate.light_room(p, now) if light_fits is None else light_fits
        while room > 0:
            if light is not None:
                if fits <= 0:
                    return  # shut for the light tenants too: their reserve is used up
                item = q.pop(eligible=light)  # shut for the others: only the light tenants' reserve
            elif room > reserve or ((head := q.peek()) is not None and head.band is Band.CRITICAL):
                item = q.pop()  # priority between bands stays strict: critical is never held back
            else:
                item = q.pop(eligible=share.eligibility(room, now, q.depth_of))
            if item is None:
                return
            self._depth -= 1
            if not item.payload.wake(None):  # its waiter is already leaving
                continue
            p.pending += 1
            share.started(item.tenant, item.weight, now)
            room -= 1
            fits -= 1
            if fits <= 0 and light is None:
                if room <= 0:
                    return
                light = share.outweighed(0, now, q.depth_of)
                fits = self._gate.light_room(p, now)

    def _refuse(
        self, p: Pool, band: Band, tenant: str, now: float, reason: Reason, drain_s: float | None = None
    ) -> GatewayError:
        """Count the refusal and build its answer (gateway/admission_refusal.py)."""
        self._m.rejections.labels(tenant, reason).inc()
        return refusal(p, band, tenant, now, reason, self._cfg, self._max_wait[band], drain_s)

    def collect(self) -> Iterable[Metric]:
        """Queue depth per pool and band, for a scrape-time callback."""
        fam = GaugeMetricFamily(
            "kvgate_queue_depth", "Requests waiting in the admission queue.", labels=["pool", "band"]
        )
        for p in self._pools:
            for band, n in p.queue.depth_by_band().items():
                fam.add_metric([p.name, band.label], n)
        yield fam
