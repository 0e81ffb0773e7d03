"""Random fleets for the latency plugins' reference tests, and the model's cost as the reference.

A `Spec` is one replica as the `latency-knee` filter and the `predicted-latency` scorer may find it
(its scrape, kvgate's ledger there, the step it last relayed, a calibration, the prefix it holds);
`fleet` builds the replicas and their estimator. `reference_cost_s` is the cost those plugins rank
by, one candidate at a time through the model's plain input methods, in the order of float operations
the request path has always used: the fast path must match it to the last bit.
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import strategies as st

from policies.latency.estimator import LatencyEstimator
from policies.latency.prior import LatencyPrior
from policies.latency.replica_model import TPOT_X_TOKENS, TTFT_X_TOKENS
from policies.latency.replica_model import ReplicaLatencyModel as Model
from policies.types import ReplicaState
from tests.policies.scheduling.builders import NOW, replica

BLOCK = 16
STALE = 1.0


class Spec(NamedTuple):
    """One replica as the scorer may find it."""

    in_flight: int
    in_flight_tokens: int
    running: int
    waiting: int
    at_scrape: int | None  # kvgate's in flight when the scrape was recorded (None: not known)
    scraped_ago: float | None  # None: never scraped
    slow: bool  # in the other pool: a prior twice as slow
    dispatched: list[int]  # the ledger: uncached tokens of each request sent
    prefilled: int  # how many of those got their first token
    step_ago: float | None  # the last chunk relayed
    observed: list[float]  # TTFTs observed, as a multiple of the prediction (calibration)
    held: int | float | None  # matched index blocks (a fraction: the exact index's conversion)


specs = st.builds(
    Spec,
    in_flight=st.integers(0, 40),
    in_flight_tokens=st.integers(0, 400_000),
    running=st.integers(0, 64),
    waiting=st.integers(0, 8),
    at_scrape=st.one_of(st.none(), st.integers(0, 40)),
    scraped_ago=st.one_of(st.none(), st.floats(0.0, 3.0)),
    slow=st.booleans(),
    dispatched=st.lists(st.integers(0, 8000), max_size=4),
    prefilled=st.integers(0, 4),
    step_ago=st.one_of(st.none(), st.floats(0.0, 0.05)),
    observed=st.lists(st.floats(0.5, 2.0), max_size=3),
    held=st.one_of(st.none(), st.integers(0, 600), st.floats(0.0, 600.0)),
)


def fleet(specs: list[Spec]) -> tuple[LatencyEstimator, list[ReplicaState], dict[str, float]]:
    """The estimator (its ledgers, step dates and calibrations as `specs` say), the replicas and the
    prefix match."""
    est = LatencyEstimator(BLOCK, priors={"slow": LatencyPrior().scaled(2.0)})
    candidates: list[ReplicaState] = []
    match: dict[str, float] = {}
    for i, spec in enumerate(specs):
        r = replica(
            f"r{i}",
            pool="slow" if spec.slow else "m",
            in_flight=spec.in_flight,
            in_flight_tokens=spec.in_flight_tokens,
            running=spec.running,
            waiting=spec.waiting,
            in_flight_at_scrape=spec.at_scrape,
            scraped_at=None if spec.scraped_ago is None else NOW - spec.scraped_ago,
        )
        tickets = [est.predict(r, u, NOW, STALE) for u in spec.dispatched]
        for t in tickets:
            est.dispatched(t)
        for t, ratio in zip(tickets, spec.observed, strict=False):
            est.observe_ttft(t, t.ttft_s * ratio)
        for t in tickets[: spec.prefilled]:
            est.prefilled(t)
        if spec.step_ago is not None:
            est.step_seen(r.name, NOW - spec.step_ago)
        if spec.held is not None:
            match[r.name] = spec.held
        candidates.append(r)
    return est, candidates, match


def reference_cost_s(
    model: Model, state: ReplicaState, fresh: bool, uncached: int, now: float, work_weight: float
) -> float:
    """Predicted TTFT of a request with `uncached` tokens to prefill on `state`'s replica, plus
    `work_weight` x the seconds of that prefill: the model's `ttft_s` with its inputs, the fits'
    coefficients multiplied before dividing by the x unit (as the request path computes it)."""
    batch = model.batch_kv_tokens(state, fresh)
    ahead = model.tokens_ahead(state, fresh, now)
    in_step = model.in_step_tokens(state, fresh)
    tpot, ttft = model.tpot, model.ttft
    step = tpot.a + tpot.b * batch / TPOT_X_TOKENS
    cost = ttft.a + ttft.b * (ahead + uncached) / TTFT_X_TOKENS
    if batch > 0:  # the rest of the step under way
        length = max(ttft.a + ttft.b * in_step / TTFT_X_TOKENS if in_step else step, step)
        last = model.last_step_at
        cost += length - (now - last) if last is not None and 0.0 <= now - last < length else 0.5 * step
    cost = max(cost, step)
    if work_weight:
        cost += work_weight * ttft.b * uncached / TTFT_X_TOKENS
    return cost


def reference_step_s(model: Model, state: ReplicaState, fresh: bool) -> float:
    """A decode step of the batch running on `state`'s replica (kvgate's in flight and a fresh
    scrape's beyond them), 0.0 when nothing runs there: the knee's allowance for the step under way."""
    batch = model.batch_kv_tokens(state, fresh)
    return model.tpot.a + model.tpot.b * batch / TPOT_X_TOKENS if batch > 0 else 0.0


def reference_running(r: ReplicaState, fresh: bool) -> int:
    """Requests decoding there for the stall term: kvgate's in flight, or a fresh scrape's running if
    more (its requests of kvgate's that ended since included)."""
    return max(r.in_flight, r.running) if fresh else r.in_flight
