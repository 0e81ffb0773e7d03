"""The latency gate's side of flow control (`flow_control.predicted_admission`): how many requests like
the next one a pool's replicas can take by what they would cost in time, and the SLOs that apply.

The rule is pure (policies/latency_admission); this reads the fleet snapshot and the latency model
(`policies.latency`) for it, per replica still under today's saturation thresholds (hard caps): the
next request's predicted TTFT there must stay within the knee x its unloaded TTFT there (and never
less than that + one decode step of the batch running there: the step under way, which no hold at
kvgate shortens), or the tightest TTFT SLO (band, tenant, `x-kvgate-ttft-slo-ms`). Its whole prompt
is priced: the prefix match is not known before routing. The predicted TTFT includes the request's
wait for free KV blocks there, as its ticket's does (`LatencyEstimator.gate_ttft_s`: the replica's
KV ledger played with the request's prompt and prefix keys, so a prefix group's blocks in flight
count once): while no replica has blocks for it, it waits at kvgate instead of in an engine that
would preempt or evict for it (docs/benchmarks.md, "The latency gate and the KV blocks").

The knee is `knee_factor` while several tenants are active in the pool, and `solo_knee_factor` (if
larger) while at most one is: then the fair queue has nobody to choose between, and holding the
engine to one prefill at a time only costs that tenant throughput (measured: docs/benchmarks.md,
"Admission on predicted latency"). A tenant that arrives finds at most that much work ahead of it,
and from then on the pool is held to `knee_factor`. A tenant is alone while no other is active in
the pool (policies/fair_share: in flight, queued, or seen within the window).

A latency reserve for light tenants: a tenant below its fair share while another is above its own
is held at `light_knee_factor` (if larger than `knee_factor`) instead, while the heavy one stops at
`knee_factor`. The flood then never fills a replica up to where a light tenant's request would be
held, so the light tenant's request goes at once instead of waiting behind the flood's queue; and
light tenants together still cannot push a replica past their own knee. The heavy one also leaves
`light_reserve` requests' worth of room at the light knee to them (`kept_for_light`, `heavy_room`):
on two replicas with 1, the flood's prefill starts on one replica only while the other's is at most
(light knee - 1) x a prefill from its end, so a light tenant's request never waits behind more than
that. The flood's prefills are staggered instead of stopped: measured at the light knee, keeping the
room costs the flood far less than at its own (docs/benchmarks.md, "The light reserve at the light
knee"). Who goes first within that room is the admission queue's (gateway/admission.py). While a
light tenant uses the pool, the heavy one's knee also has no decode-step floor
(`latency_admission.knee_bound_s`): holding it cannot shorten its own wait for the step under way,
but it keeps room for the light tenant, whose knee keeps the floor (docs/benchmarks.md, "A decode
step in the knee").
"""

from __future__ import annotations

import math

from gateway.admission_pools import AdmissionPools, Pool
from gateway.config import FlowControlConfig
from policies.latency.estimator import LatencyEstimator
from policies.latency_admission import LatencySlo, excess_s, replica_room, ttft_bound_s
from policies.saturation import replica_headroom
from policies.types import Band


def _band_slos(cfg: FlowControlConfig) -> dict[Band, LatencySlo]:
    out = dict.fromkeys(Band, LatencySlo())
    for name, band in cfg.bands.items():
        out[Band.parse(name)] = LatencySlo(band.ttft_slo_s, band.tpot_slo_s)
    return out


class LatencyGate:
    """One per `AdmissionQueue`, over its pools. `latency`: the router's estimator (None: the gate is
    never on)."""

    def __init__(
        self, cfg: FlowControlConfig, latency: LatencyEstimator | None, pools: AdmissionPools
    ) -> None:
        self._latency = latency
        self._pools = pools
        self._cfg = cfg
        self._band_slo = _band_slos(cfg)

    def reconfigure(self, cfg: FlowControlConfig) -> None:
        self._cfg = cfg
        self._band_slo = _band_slos(cfg)

    @property
    def on(self) -> bool:
        return self._latency is not None and self._cfg.predicted_admission

    def slo(self, band: Band, slo: LatencySlo) -> LatencySlo:
        """`slo` (the tenant's and the request's) tightened by the band's."""
        return self._band_slo[band].tighten(slo)

    def knee(self, alone: bool, light: bool = False) -> float:
        """The knee for a request of a tenant alone in the pool, or of a light one (below its fair
        share while another is above its own: `light_knee_factor`), or of anyone else."""
        cfg = self._cfg
        if light:
            return max(cfg.knee_factor, cfg.light_knee_factor)
        return max(cfg.knee_factor, cfg.solo_knee_factor) if alone else cfg.knee_factor

    def room(
        self, p: Pool, now: float, prompt_tokens: int, slo: LatencySlo, light: bool = False,
        prefix_keys: tuple[int, ...] = (),
    ) -> tuple[int, float]:  # fmt: skip
        """Requests like this one (`prompt_tokens`, `prefix_keys`, `slo`) the pool's replicas can take
        by the gate (at the light tenants' knee with `light`), less those released and not yet
        dispatched; and the least predicted drain (seconds) before one of them would take it."""
        est = self._latency
        assert est is not None
        alone = p.share.alone(now, p.queue.depth_of)
        # The knee's decode step (`knee_bound_s`), except for the heavy tenant's knee while a light
        # one uses the pool: holding the heavy tenant then keeps the room the light one comes into.
        stepped = light or not p.share.someone_outweighed(0, now, p.queue.depth_of)
        replicas = self._pools.replicas()
        thr = self._pools.thr
        stale, knee = thr.stale_after_s, self.knee(alone, light)
        tokens = max(0, prompt_tokens)
        room = 0
        drain = math.inf
        for i in p.indexes:
            r = replicas[i]
            if replica_headroom(r, thr, now) <= 0:
                continue
            predicted, step = est.ttft_and_step_s(r, tokens, now, stale)
            if not stepped:
                step = 0.0
            unloaded = est.unloaded_ttft_s(r, tokens)
            bound = ttft_bound_s(unloaded, knee, slo.ttft_s, step)
            if predicted <= bound:
                # Within the bound before its wait for KV blocks: play the ledger for that wait.
                # Over it, the wait could only add, and the play is the costly part (~0.1 ms a
                # replica short of blocks at 64 in flight: docs/benchmarks.md, "The latency gate
                # and the KV blocks"); the drain there is then the queue's alone, a lower bound.
                # The play stops once the price passes the bound by the least drain so far: then
                # the replica takes nothing and cannot lower the pool's drain, so both come out
                # as a whole play would make them.
                predicted = est.gate_ttft_s(r, tokens, prefix_keys, now, stale, predicted, bound + drain)
            tpot = est.tpot_s(r, now, stale) if slo.tpot_s is not None else 0.0
            room += replica_room(predicted, unloaded, est.prefill_s(r, tokens), knee, slo, tpot, step)
            drain = min(drain, excess_s(predicted, unloaded, knee, slo, step))
        return room - p.pending, drain

    def kept_for_light(self, p: Pool, now: float) -> int:
        """The requests' worth of room at the light tenants' knee a heavy tenant must leave
        (`light_reserve`, at most the pool's replicas less one, so the heavy tenant is never shut out
        of the pool): while some tenant is below its fair share and another above its own, else 0."""
        keep = self._cfg.light_reserve
        if keep and p.share.someone_outweighed(0, now, p.queue.depth_of):
            return max(0, min(keep, self._pools.serving(p) - 1))
        return 0

    def heavy_room(
        self, p: Pool, now: float, fits: int, prompt_tokens: int, slo: LatencySlo,
        prefix_keys: tuple[int, ...] = (),
    ) -> tuple[int, int | None]:  # fmt: skip
        """`fits` (`room` for a request like this one) less what a heavy tenant must leave to the light
        ones: while `kept_for_light` is k > 0, only as many as keep k requests' room at the light
        knee. Each request the heavy tenant sends takes exactly one of that room: the replica it goes
        to is within its knee, so within the light one, and one more prefill there fills one place.
        Also the room at the light knee it priced for that (None when it priced none), which the
        caller reuses for the light tenants' room instead of pricing the pool again."""
        keep = self.kept_for_light(p, now) if fits > 0 else 0
        if not keep:
            return fits, None
        light = self.room(p, now, prompt_tokens, slo, True, prefix_keys)[0]
        return min(fits, light - keep), light

    def light_room(self, p: Pool, now: float) -> int:
        """`room` at the light tenants' knee, sized by the pool's queue's head (0 when empty)."""
        head = p.queue.peek()
        if head is None:
            return 0
        w = head.payload
        return self.room(p, now, w.prompt_tokens, w.slo, True, w.prefix_keys)[0]
