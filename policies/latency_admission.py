"""Admission on predicted latency: may a pool take one more request now, by what it would cost in time?

The saturation detector (policies/saturation) counts requests: in flight, waiting in the engine,
KV usage. Counts do not say what the next dispatch costs the requests already inside: with the
default 128 slots per replica a flood is "not saturated" while every prompt shares its engine steps
with the flood's, and a burst of completions becomes a burst of prefills. This gate keeps each
replica near its knee instead, so the queue forms at the gateway, where the fair queue decides who
goes next (issue #11).

The rule, per request and replica (the latency model: `policies.latency`):

    unloaded  = the request's predicted TTFT on that replica with nothing ahead of it
    knee      = knee_factor x unloaded, and at least unloaded + one decode step of the batch running
                there (no step when nothing runs)
    bound     = min(knee, the tightest TTFT SLO that applies), never below unloaded
    predicted = its predicted TTFT there now (the work ahead, the step under way, its own prefill,
                its wait for free KV blocks there)
    room      = 0 if predicted > bound, else 1 + how many more requests of its size fit below bound

The decode step in the knee: a request sent to a replica that is running anything waits for the
step under way, up to one decode step, however long kvgate holds it (the replica keeps stepping), so
that wait is not a queue the gate can shorten. For a short prompt, whose unloaded TTFT is about one
step, `knee_factor` x unloaded alone was crossed whenever a step was under way: at 2 streams per
replica on 256-token prompts the gate held 58-100% of the requests and their TTFT p90 was 115-165 ms
against 14 ms (docs/benchmarks.md, "A decode step in the knee"). A long prompt's knee is unchanged:
(knee_factor - 1) x its unloaded TTFT is more than a step. The caller leaves the step out of a heavy
tenant's knee while a light one uses the pool (gateway/latency_gate.py).

A TTFT SLO tighter than the request's unloaded TTFT cannot be met anywhere: the request then goes
only to a replica with nothing ahead of it. With a TPOT SLO, a replica whose predicted time per
output token is already over it takes nothing. The SLOs that apply are the band's, the tenant's and
the request's header `x-kvgate-ttft-slo-ms`, the tightest winning: the header can only tighten.

Pure: the caller passes every number; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.retry_after import retry_after_from_queue

TTFT_SLO_HEADER = "x-kvgate-ttft-slo-ms"
MAX_HEADER_SLO_MS = 3_600_000.0  # an hour: anything longer is a client bug, not an SLO
_UNBOUNDED_ROOM = 1 << 20  # a request that costs no prefill time: room is not limited by latency


@dataclass(frozen=True, slots=True)
class LatencySlo:
    """TTFT and TPOT bounds in seconds (None: none given). Combine with `tighten`."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")

    def tighten(self, other: LatencySlo) -> LatencySlo:
        """The tighter of the two bounds of each kind (an SLO can only tighten another)."""
        return LatencySlo(_min(self.ttft_s, other.ttft_s), _min(self.tpot_s, other.tpot_s))


NO_SLO = LatencySlo()


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a < b else b


def parse_ttft_slo_header(raw: bytes | None) -> float | None:
    """`x-kvgate-ttft-slo-ms` in seconds: a plain decimal number of milliseconds in
    (0, `MAX_HEADER_SLO_MS`]. None when absent. ValueError (the caller answers 400) for anything
    else: empty, signs, exponents, nan/inf, zero, too long. It is combined with `tighten`, so a
    value looser than the configured SLOs has no effect."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or len(text) > 16 or not all(c in b"0123456789." for c in text) or text.count(b".") > 1:
        raise ValueError("must be a positive number of milliseconds, such as 250 or 80.5")
    if text == b".":
        raise ValueError("must be a positive number of milliseconds, such as 250 or 80.5")
    ms = float(text)
    if not 0 < ms <= MAX_HEADER_SLO_MS:
        raise ValueError(f"must be in (0, {MAX_HEADER_SLO_MS:.0f}] milliseconds")
    return ms / 1000.0


def knee_bound_s(unloaded_s: float, knee_factor: float, step_s: float = 0.0) -> float:
    """The knee (module docstring): `knee_factor` x `unloaded_s`, at least `unloaded_s` + `step_s`,
    the decode step of the batch running on the replica (0 when nothing runs there)."""
    bound = knee_factor * unloaded_s
    floor = unloaded_s + step_s
    return bound if bound > floor else floor


def ttft_bound_s(
    unloaded_s: float, knee_factor: float, ttft_slo_s: float | None, step_s: float = 0.0
) -> float:
    """The highest predicted TTFT a replica may show for the request to be sent there now: the knee
    (`knee_bound_s`), or a tighter TTFT SLO, but never below the unloaded TTFT."""
    bound = knee_bound_s(unloaded_s, knee_factor, step_s)
    if ttft_slo_s is not None and ttft_slo_s < bound:
        bound = ttft_slo_s
    return bound if bound > unloaded_s else unloaded_s


def replica_room(
    predicted_s: float,
    unloaded_s: float,
    per_request_s: float,
    knee_factor: float,
    slo: LatencySlo,
    tpot_s: float = 0.0,
    step_s: float = 0.0,
) -> int:
    """How many requests like this one the replica can take now (module docstring): 0 when its
    predicted TTFT is over the bound (or its predicted TPOT over a TPOT SLO), else 1 + those that
    fit in the slack at `per_request_s` (each one's own prefill seconds there) apiece. `step_s`: the
    decode step of the batch running there (0 when nothing runs)."""
    if slo.tpot_s is not None and tpot_s > slo.tpot_s:
        return 0
    bound = ttft_bound_s(unloaded_s, knee_factor, slo.ttft_s, step_s)
    if not predicted_s <= bound:  # also NaN
        return 0
    if not per_request_s > 0:
        return _UNBOUNDED_ROOM
    more = (bound - predicted_s) / per_request_s
    return 1 + (int(more) if more < _UNBOUNDED_ROOM else _UNBOUNDED_ROOM)


def excess_s(
    predicted_s: float, unloaded_s: float, knee_factor: float, slo: LatencySlo, step_s: float = 0.0
) -> float:
    """Seconds of work the replica must drain before the request fits under its bound (0 if it fits)."""
    over = predicted_s - ttft_bound_s(unloaded_s, knee_factor, slo.ttft_s, step_s)
    return over if over > 0 else 0.0


def retry_after_from_drain(excess: float, *, fallback_s: int) -> int:
    """Retry-After for a request refused by the gate: the predicted drain of the least loaded
    replica down to the request's bound (`excess_s`, seconds of its work at its own rate), rounded
    up to whole seconds, at least 1; `fallback_s` when unknown (not finite)."""
    if not math.isfinite(excess):
        return retry_after_from_queue(math.nan, 0.0, fallback_s=fallback_s)
    return retry_after_from_queue(excess, 1.0, fallback_s=fallback_s)
