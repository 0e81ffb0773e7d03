"""Goodput headroom: how much more load a pool could take while meeting its TTFT and TPOT SLOs.

Built on each replica's calibrated latency model (`replica_model`), whose coefficients are the
roofline's (napkin.md: a step costs a fixed part, the weights' read plus the overhead, and a part
that grows with the work in it):

- `c` = decode step with an empty batch (the TPOT fit's intercept, seconds);
- `d` = seconds per KV token a decode step reads (the TPOT fit's slope);
- `p` = seconds per uncached prefill token (the TTFT fit's slope); `a` = the TTFT fit's intercept.

And the pool's observed request mix (`RequestMix`, an EWMA the gateway keeps per pool): mean prompt
tokens `P`, uncached prefill tokens `U` and output tokens `O`.

The napkin, for one replica at a steady arrival rate `lam` (requests/s):

1. Every step reads the weights (`c`) and every running request's KV; a request in decode holds on
   average `P + O/2` tokens of context; its prefill's `U` tokens ride in some step too. So the work
   one request adds to the engine beyond the fixed part is `W = U p + O d (P + O/2)` seconds, and the
   engine's busy share beyond the fixed part is `rho = lam W`.
2. A step takes `c` plus the share of the other work that lands in it; with `rho` of every second
   spent on that work, `step = c / (1 - rho)`. TPOT is one step: TPOT(lam) = c / (1 - rho).
3. TTFT is the request's own prefill and the wait for the step under way (half a step, as the
   model's `wait_s`), both slowed by the engine's other work as in a processor-sharing queue:
   TTFT(lam) = a + (U p + c/2) / (1 - rho).
4. Meeting both SLOs (`ttft_slo_s` = S, `tpot_slo_s` = T) bounds `rho`:
   rho_max = min(1 - c / T, 1 - (U p + c/2) / (S - a)), floored at 0 (an SLO the replica cannot meet
   even idle gives it no capacity), and the replica's capacity is lam_max = rho_max / W.
5. Its current rate comes from what is busy there now by Little's law: N requests busy, each living
   about O steps, N = lam O step = lam O c / (1 - lam W), so lam_now = N / (O c + N W). N is the
   larger of kvgate's own in-flight count and (from a fresh scrape) running + waiting: other
   gateways' requests load the replica too. lam_now tends to 1/W as N grows, the saturated rate.

Extrapolation. The slopes are what headroom extrapolates with, and a replica seen only at low load
cannot tell them: at a small batch the KV read is a fraction of a millisecond of a step, and the fit
puts it in the intercept or the slope alike (on the simulator the TPOT slope calibrated to 5-30% of
the roofline's, with a posterior standard deviation of ~70% of it, and the fits' own slopes put the
knee 18-40% too high when read at a sixth to a third of it). So `p` and `d` are each fit's slope
plus one posterior standard deviation (`LinearFit.p11`; `slope_sigmas`): before calibration that is
twice the prior (the prior is "could be 2x off"), and the margin shrinks as the replica is seen
over a range of batch sizes. Measured (docs/benchmarks.md, "Goodput headroom"): 0.92-0.98 of the
knee read at a third of it, 0.67-0.70 at a twelfth, never above. Cautious is the right side to err
on for scaling out.

Headroom per replica = lam_max - lam_now (negative when the replica is past the load at which the
SLOs hold); the pool's is the sum over its in-service healthy replicas, so replicas of different
speeds add their own capacities, less the gateway's own backlog: Q requests queued at kvgate
(admission holds them when the replicas are full) must start within the TTFT SLO, a rate of Q / S
on top of the arrivals. Without it a fleet that admission keeps at its knee would show ~0 headroom
however long the queue in front of it. `ratio` is headroom / capacity (1 - ratio is the pool's load as a
share of what it can serve within the SLOs: an autoscaler's utilisation). Tokens/s are the
requests/s times the mix's mean prompt and output tokens. The formula ignores the engine's own
caps (max_num_seqs, KV blocks): past them a replica queues, which a fresh scrape shows as waiting
requests and the Little's-law estimate counts.

Pure: the caller passes the models, the fleet's states and the mix; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policies.latency.replica_model import TPOT_X_TOKENS, TTFT_X_TOKENS, ReplicaLatencyModel, others_beyond
from policies.types import ReplicaState

_MIX_WEIGHT = 0.05  # EWMA weight of one finished request in the pool's mix


@dataclass(frozen=True, slots=True)
class Slos:
    """The SLOs headroom is computed against (seconds)."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"SLOs must be > 0, got ttft {self.ttft_s}, tpot {self.tpot_s}")


@dataclass(frozen=True, slots=True)
class Mix:
    """A pool's mean request: prompt tokens, of which uncached (to prefill), and output tokens."""

    prompt_tokens: float
    uncached_tokens: float
    output_tokens: float


class RequestMix:
    """The EWMA of finished requests' tokens (one per pool, kept by the gateway). `default` is what
    it says before the first request."""

    __slots__ = ("_mix", "count")

    def __init__(self, default: Mix) -> None:
        self._mix = default
        self.count = 0

    @property
    def mix(self) -> Mix:
        return self._mix

    def observe(self, prompt: int, uncached: int, output: int) -> None:
        if prompt < 0 or uncached < 0 or output < 1:
            return
        m = self._mix
        w = 1.0 if self.count == 0 else _MIX_WEIGHT
        self._mix = Mix(
            m.prompt_tokens + w * (prompt - m.prompt_tokens),
            m.uncached_tokens + w * (min(uncached, prompt) - m.uncached_tokens),
            m.output_tokens + w * (output - m.output_tokens),
        )
        self.count += 1


@dataclass(frozen=True, slots=True)
class ReplicaHeadroom:
    """One replica's capacity under the SLOs, its current rate and the difference (requests/s)."""

    replica: str
    capacity_rps: float
    load_rps: float
    busy: int

    @property
    def headroom_rps(self) -> float:
        return self.capacity_rps - self.load_rps


@dataclass(frozen=True, slots=True)
class PoolHeadroom:
    """A pool's headroom: requests/s, and tokens/s of prompt and output at the pool's mix."""

    pool: str
    capacity_rps: float
    load_rps: float
    mix: Mix
    replicas: tuple[ReplicaHeadroom, ...]
    backlog_rps: float = 0.0  # requests queued at the gateway, to be served within the TTFT SLO

    @property
    def headroom_rps(self) -> float:
        return self.capacity_rps - self.load_rps - self.backlog_rps

    @property
    def ratio(self) -> float:
        """Headroom as a share of the pool's SLO capacity: 1 idle, 0 at the knee, negative past it;
        -1 when the pool has no capacity at all (no replica in service, or SLOs below an idle
        replica's latency)."""
        return self.headroom_rps / self.capacity_rps if self.capacity_rps > 0 else -1.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.headroom_rps * self.mix.prompt_tokens

    @property
    def output_tokens_per_s(self) -> float:
        return self.headroom_rps * self.mix.output_tokens


def coefficients(model: ReplicaLatencyModel, slope_sigmas: float = 1.0) -> tuple[float, float, float, float]:
    """(a, p, c, d) of the module docstring from a replica's calibrated fits (seconds; per token),
    each slope `slope_sigmas` posterior standard deviations up (module docstring, "Extrapolation")."""
    ttft, tpot = model.ttft, model.tpot
    return (
        ttft.a,
        (ttft.b + slope_sigmas * math.sqrt(ttft.p11)) / TTFT_X_TOKENS,
        tpot.a,
        (tpot.b + slope_sigmas * math.sqrt(tpot.p11)) / TPOT_X_TOKENS,
    )


def work_s(p: float, d: float, mix: Mix) -> float:
    """W: engine seconds one request of `mix` adds beyond the fixed step cost."""
    return mix.uncached_tokens * p + mix.output_tokens * d * (mix.prompt_tokens + mix.output_tokens / 2)


def capacity_rps(coef: tuple[float, float, float, float], mix: Mix, slos: Slos) -> float:
    """lam_max: the steady rate at which the replica still meets both SLOs (module docstring, 4)."""
    a, p, c, d = coef
    w = work_s(p, d, mix)
    if w <= 0:
        return 0.0
    rho_tpot = 1.0 - c / slos.tpot_s
    budget = slos.ttft_s - a
    rho_ttft = 1.0 - (mix.uncached_tokens * p + c / 2) / budget if budget > 0 else 0.0
    rho = min(rho_tpot, rho_ttft)
    return rho / w if rho > 0 else 0.0


def load_rps(coef: tuple[float, float, float, float], mix: Mix, busy: float) -> float:
    """lam_now from `busy` requests by Little's law (module docstring, 5)."""
    if busy <= 0:
        return 0.0
    _, p, c, d = coef
    return busy / (max(mix.output_tokens, 1.0) * c + busy * work_s(p, d, mix))


def busy_requests(state: ReplicaState, fresh: bool) -> int:
    """Requests occupying the replica: kvgate's own, and when the scrape is fresh the running +
    waiting it saw beyond kvgate's in flight at the time (other gateways' requests)."""
    busy = state.in_flight
    return busy + others_beyond(state, state.running + state.waiting) if fresh else busy


def replica_headroom(
    state: ReplicaState,
    model: ReplicaLatencyModel,
    mix: Mix,
    slos: Slos,
    fresh: bool,
    slope_sigmas: float = 1.0,
) -> ReplicaHeadroom:
    coef = coefficients(model, slope_sigmas)
    busy = busy_requests(state, fresh)
    return ReplicaHeadroom(state.name, capacity_rps(coef, mix, slos), load_rps(coef, mix, busy), busy)


def pool_headroom(
    pool: str,
    states: Iterable[ReplicaState],
    models: Mapping[str, ReplicaLatencyModel],
    default_model: ReplicaLatencyModel,
    mix: Mix,
    slos: Slos,
    now: float,
    stale_after_s: float,
    slope_sigmas: float = 1.0,
    queued: int = 0,
) -> PoolHeadroom:
    """The headroom of `pool`'s in-service healthy replicas among `states`. A replica kvgate has no
    model for yet counts with `default_model` (its pool's prior). A replica out of service or
    ejected adds no capacity, but the load still on it is not counted either: it is draining.
    `queued`: the pool's requests waiting at the gateway (admission's queue), counted as the extra
    rate of serving them within the TTFT SLO (module docstring)."""
    out = []
    for state in states:
        if state.pool != pool or not (state.in_service and state.healthy):
            continue
        model = models.get(state.name, default_model)
        fresh = state.is_fresh(now, stale_after_s)
        out.append(replica_headroom(state, model, mix, slos, fresh, slope_sigmas))
    return PoolHeadroom(
        pool,
        sum(r.capacity_rps for r in out),
        sum(r.load_rps for r in out),
        mix,
        tuple(out),
        queued / slos.ttft_s,
    )
