"""Goodput headroom (policies/latency/headroom.py): the pure function's properties."""

from __future__ import annotations

import itertools

import pytest

from policies.latency.headroom import (
    Mix,
    RequestMix,
    Slos,
    busy_requests,
    capacity_rps,
    coefficients,
    load_rps,
    pool_headroom,
    work_s,
)
from policies.latency.prior import LatencyPrior
from policies.latency.replica_model import ReplicaLatencyModel
from policies.types import ReplicaPhase, ReplicaState

PRIOR = LatencyPrior()
MIX = Mix(prompt_tokens=1000.0, uncached_tokens=600.0, output_tokens=200.0)
SLOS = Slos(ttft_s=0.5, tpot_s=0.05)


def state(name: str, running: int = 0, waiting: int = 0, in_flight: int = 0, **kw: object) -> ReplicaState:
    return ReplicaState(
        name, f"http://{name}", "m", scraped_at=0.0, running=running, waiting=waiting, in_flight=in_flight,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def headroom(states: list[ReplicaState], models: dict[str, ReplicaLatencyModel] | None = None) -> float:
    ph = pool_headroom("m", states, models or {}, ReplicaLatencyModel(PRIOR), MIX, SLOS, 0.0, 5.0)
    return ph.headroom_rps


def test_headroom_falls_monotonically_as_load_rises_and_goes_negative() -> None:
    values = [headroom([state("r0", running=n)]) for n in range(0, 400, 10)]
    assert values[0] > 0
    assert all(b < a for a, b in itertools.pairwise(values))
    assert values[-1] < 0


def test_zero_at_the_knee_of_a_synthetic_model() -> None:
    # The synthetic replica: step = c / (1 - lam W), N = lam O step (Little). At lam_max its busy
    # count is the knee, and the headroom there is ~0; TPOT at the knee is exactly the SLO (when
    # TPOT binds) or TTFT is (when TTFT binds).
    coef = coefficients(ReplicaLatencyModel(PRIOR))
    a, p, c, d = coef
    lam = capacity_rps(coef, MIX, SLOS)
    w = work_s(p, d, MIX)
    step = c / (1 - lam * w)
    ttft = a + (MIX.uncached_tokens * p + c / 2) / (1 - lam * w)
    assert step <= SLOS.tpot_s + 1e-9 and ttft <= SLOS.ttft_s + 1e-9
    assert step == pytest.approx(SLOS.tpot_s) or ttft == pytest.approx(SLOS.ttft_s)
    busy = lam * MIX.output_tokens * step
    assert load_rps(coef, MIX, busy) == pytest.approx(lam)
    # At the nearest whole request counts either side of the knee the sign flips.
    below, above = headroom([state("r0", running=int(busy))]), headroom([state("r0", running=int(busy) + 1)])
    assert below >= 0 > above
    assert abs(below) < 0.02 * lam


def test_per_replica_speeds_add_up() -> None:
    fast = ReplicaLatencyModel(PRIOR)
    slow = ReplicaLatencyModel(PRIOR.scaled(2.0))
    one_fast = pool_headroom("m", [state("a")], {"a": fast}, fast, MIX, SLOS, 0.0, 5.0)
    one_slow = pool_headroom("m", [state("b")], {"b": slow}, fast, MIX, SLOS, 0.0, 5.0)
    both = pool_headroom("m", [state("a"), state("b")], {"a": fast, "b": slow}, fast, MIX, SLOS, 0.0, 5.0)
    assert both.capacity_rps == pytest.approx(one_fast.capacity_rps + one_slow.capacity_rps)
    assert one_slow.capacity_rps < one_fast.capacity_rps
    # Twice the replicas of one speed, twice the idle headroom.
    assert headroom([state("a"), state("b")]) == pytest.approx(2 * headroom([state("a")]))


def test_tokens_per_second_follow_the_mix() -> None:
    ph = pool_headroom("m", [state("a", running=5)], {}, ReplicaLatencyModel(PRIOR), MIX, SLOS, 0.0, 5.0)
    assert ph.prompt_tokens_per_s == pytest.approx(ph.headroom_rps * 1000.0)
    assert ph.output_tokens_per_s == pytest.approx(ph.headroom_rps * 200.0)


def test_a_tighter_slo_leaves_less_headroom_and_an_impossible_one_none() -> None:
    coef = coefficients(ReplicaLatencyModel(PRIOR))
    loose = capacity_rps(coef, MIX, Slos(1.0, 0.1))
    tight = capacity_rps(coef, MIX, Slos(0.2, 0.02))
    assert loose > tight > 0
    assert capacity_rps(coef, MIX, Slos(1.0, PRIOR.decode_step_s / 2)) == 0.0  # below one idle step


def test_load_counts_other_gateways_only_from_a_fresh_scrape() -> None:
    fresh = headroom([state("r0", running=40, in_flight=5)])
    own = headroom([state("r0", running=5, in_flight=5)])
    assert fresh < own
    stale = pool_headroom(
        "m", [state("r0", running=40, in_flight=5)], {}, ReplicaLatencyModel(PRIOR), MIX, SLOS, 100.0, 5.0
    )
    assert stale.headroom_rps == pytest.approx(own)
    assert headroom([state("r0", running=10, waiting=30)]) < headroom([state("r0", running=10)])


def test_out_of_service_and_other_pools_add_nothing() -> None:
    one = headroom([state("a")])
    assert headroom([state("a"), state("b", healthy=False)]) == pytest.approx(one)
    assert headroom([state("a"), state("b", phase=ReplicaPhase.TERMINATING)]) == pytest.approx(one)
    other = ReplicaState("c", "http://c", "other")
    assert headroom([state("a"), other]) == pytest.approx(one)


def test_request_mix_starts_at_the_first_request_then_averages() -> None:
    mix = RequestMix(Mix(1.0, 1.0, 1.0))
    mix.observe(2000, 500, 100)
    assert mix.mix == Mix(2000.0, 500.0, 100.0)
    mix.observe(0, 0, 100)
    assert 1900 <= mix.mix.prompt_tokens < 2000
    mix.observe(10, 10, 0)  # no output: not a sample
    assert mix.count == 2


def test_the_ratio_is_one_idle_zero_at_the_knee_and_minus_one_without_capacity() -> None:
    model = ReplicaLatencyModel(PRIOR)
    idle = pool_headroom("m", [state("a")], {}, model, MIX, SLOS, 0.0, 5.0)
    assert idle.ratio == pytest.approx(1.0)
    busy = pool_headroom("m", [state("a", running=60)], {}, model, MIX, SLOS, 0.0, 5.0)
    assert busy.ratio == pytest.approx(1 - busy.load_rps / busy.capacity_rps)
    none = pool_headroom("m", [state("a", healthy=False)], {}, model, MIX, SLOS, 0.0, 5.0)
    assert none.ratio == -1.0


def test_requests_queued_at_the_gateway_count_at_the_rate_the_ttft_slo_asks() -> None:
    model = ReplicaLatencyModel(PRIOR)
    none = pool_headroom("m", [state("a", running=20)], {}, model, MIX, SLOS, 0.0, 5.0)
    queued = pool_headroom("m", [state("a", running=20)], {}, model, MIX, SLOS, 0.0, 5.0, queued=10)
    assert queued.backlog_rps == pytest.approx(10 / SLOS.ttft_s)
    assert queued.headroom_rps == pytest.approx(none.headroom_rps - 10 / SLOS.ttft_s)
    assert queued.capacity_rps == none.capacity_rps and queued.load_rps == none.load_rps


def test_busy_counts_others_beyond_kvgate_s_in_flight_at_the_scrape() -> None:
    """A fresh scrape's running + waiting beyond kvgate's in flight when it was taken are other
    senders'; kvgate's own that ended since are not counted again."""

    def r(**fields: int | None) -> ReplicaState:
        return ReplicaState("r", "http://r", "m", scraped_at=0.0, **fields)  # type: ignore[arg-type]

    assert busy_requests(r(running=2, waiting=1, in_flight=0, in_flight_at_scrape=3), True) == 0
    assert busy_requests(r(running=2, waiting=1, in_flight=1, in_flight_at_scrape=1), True) == 3
    assert busy_requests(r(running=2, waiting=1, in_flight=0), True) == 3  # not known: vs in_flight
    assert busy_requests(r(running=9, in_flight=2, in_flight_at_scrape=0), False) == 2  # stale
