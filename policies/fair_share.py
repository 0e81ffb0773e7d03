"""Which tenants may take a pool's last free slots: the fair-share reserve.

Why. kvgate's fleet is non-preemptive: a request holds its slot until its last token. While one
tenant offers far more than its share, the fair queue serves the other tenants first, but only
when a slot frees, and a pool full of the heavy tenant's requests frees its slots in bursts (they
were started together and finish together). Measured with `loadtests.noisy_bench`: a light tenant's
requests then waited at kvgate for most of a request's duration, half a second of simulated time,
for a 30 ms solo TTFT. Holding back the last few slots of the pool from tenants already above their
fair share keeps room for the others the moment they send.

The rule. A pool's room is the number of requests it can take now (gateway/admission_pools). While the
room is at most `reserve`, only a tenant below its fair share may take a slot:

    share(t) = capacity * weight(t) / sum of the weights of the ACTIVE tenants
    below share  <=>  in_flight(t) < share(t)

where `capacity` is the pool's requests in flight plus its room, and a tenant is active while it has
requests in flight or queued in the pool, or had within the last `window_s` seconds (so a tenant
sending steadily keeps its share between two requests). A tenant alone is below its share until it
holds the whole pool, so with one active tenant the reserve costs nothing; the price with several is
up to `reserve` idle slots while the light tenants do not use them.

Pure: the caller passes `now` and the queued counts; no I/O, not thread-safe (one event loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Tenant:
    weight: float
    in_flight: int = 0
    last_seen: float = -math.inf


@dataclass(slots=True)
class FairShare:
    """Requests in flight per tenant in one pool, and who is below its fair share of it."""

    window_s: float
    _tenants: dict[str, _Tenant] = field(default_factory=dict)
    _in_flight: int = 0

    def __post_init__(self) -> None:
        if not (self.window_s >= 0 and math.isfinite(self.window_s)):
            raise ValueError(f"window_s must be a finite number >= 0, got {self.window_s!r}")

    @property
    def in_flight(self) -> int:
        """Requests of every tenant in flight in the pool."""
        return self._in_flight

    def in_flight_of(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        return 0 if t is None else t.in_flight

    def seen(self, tenant: str, weight: float, now: float) -> None:
        """`tenant` (of `weight` > 0) sent a request: it is active from now."""
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant(weight)
        t.weight = weight
        t.last_seen = max(t.last_seen, now)

    def started(self, tenant: str, weight: float, now: float) -> None:
        """A request of `tenant` took a slot. Pair with exactly one `ended`."""
        self.seen(tenant, weight, now)
        self._tenants[tenant].in_flight += 1
        self._in_flight += 1

    def ended(self, tenant: str, now: float) -> None:
        """The request counted by `started` gave its slot back (finished, failed or abandoned)."""
        t = self._tenants.get(tenant)
        if t is None or t.in_flight <= 0:
            return  # unpaired: never below zero
        t.in_flight -= 1
        self._in_flight -= 1
        t.last_seen = max(t.last_seen, now)

    def alone(self, now: float, queued: Callable[[str], int]) -> bool:
        """Whether at most one tenant is active in the pool (the module docstring's "active"): then
        the fair queue has nobody to choose between."""
        horizon = now - self.window_s
        active = 0
        for name, t in self._tenants.items():
            if t.in_flight > 0 or t.last_seen >= horizon or queued(name) > 0:
                active += 1
                if active > 1:
                    return False
        return True

    def below_share(self, tenant: str, room: int, now: float, queued: Callable[[str], int]) -> bool:
        """May `tenant` take one of the pool's reserved slots? (`room` >= 1: what the pool can take
        now; `queued(name)`: that tenant's requests waiting in the pool's queue.)"""
        return self.eligibility(room, now, queued)(tenant)

    def eligibility(self, room: int, now: float, queued: Callable[[str], int]) -> Callable[[str], bool]:
        """`below_share` for many tenants at one moment: the active weights are summed once, O(tenants
        seen within the window or still holding requests), forgetting the others on the way; each
        call of the result is O(1)."""
        total_weight = 0.0
        gone: list[str] = []
        horizon = now - self.window_s
        for name, t in self._tenants.items():
            if t.in_flight > 0 or t.last_seen >= horizon or queued(name) > 0:
                total_weight += t.weight
            else:
                gone.append(name)  # holds nothing and is not active: asking about it gives True
        for name in gone:
            del self._tenants[name]
        capacity = self._in_flight + room
        tenants = self._tenants

        def below(tenant: str) -> bool:
            me = tenants.get(tenant)
            # Never seen (or forgotten): holds nothing. Otherwise it counts among the active ones.
            return me is None or me.in_flight < capacity * me.weight / total_weight

        return below

    def outweighed(self, room: int, now: float, queued: Callable[[str], int]) -> Callable[[str], bool]:
        """For the latency gate (policies/latency_admission): is a tenant below its fair share while
        another active tenant is not? Such a tenant's load is not what fills the pool, so it is never
        held or shed by the gate for the heavy one (the hard caps still apply). With one active tenant
        (or all below their share) the answer is False for everyone: the gate holds them all. `room`
        here is what the gate lets through (not the slots), so the shares are of what the pool takes."""
        below = self.eligibility(room, now, queued)
        heavy = [name for name in self._tenants if not below(name)]

        def light(tenant: str) -> bool:
            return bool(heavy) and below(tenant)

        return light

    def someone_outweighed(self, room: int, now: float, queued: Callable[[str], int]) -> bool:
        """Whether `outweighed` is true for some tenant with requests in flight or queued in the pool:
        a light tenant using the pool beside a heavy one (the latency gate then keeps room for it). A
        tenant active only by the window does not count: a pool's only sender, just after another
        tenant left, would otherwise keep room for nobody."""
        light = self.outweighed(room, now, queued)
        return any(
            (t.in_flight > 0 or queued(name) > 0) and light(name) for name, t in list(self._tenants.items())
        )
