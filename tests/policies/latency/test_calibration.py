"""The latency model's online calibration: from priors 2x off to a replica's true rates, per replica,
and what it refuses to learn from (stale inputs, outliers)."""

import random

import pytest

from policies.latency.estimator import LatencyEstimator, Prediction
from policies.latency.prior import LatencyPrior
from policies.latency.replica_model import TPOT_X_TOKENS, TTFT_X_TOKENS
from policies.latency.rls import LinearFit
from policies.types import ReplicaState

NOW = 100.0
TRUE = LatencyPrior(
    prefill_s_per_token=4e-5, ttft_fixed_s=0.02, decode_step_s=0.01, decode_s_per_kv_token=1e-7
)


def state(name: str = "r", **fields: object) -> ReplicaState:
    values: dict[str, object] = {"url": f"http://{name}", "pool": "m", "scraped_at": NOW}
    values.update(fields)
    return ReplicaState(name=name, **values)  # type: ignore[arg-type]


def true_ttft(p: LatencyPrior, tokens: float, batch_kv: float = 0.0) -> float:
    """A replica's real TTFT: fixed + prefill, and when busy half of the decode step under way."""
    busy = 0.5 * true_tpot(p, batch_kv) if batch_kv > 0 else 0.0
    return p.ttft_fixed_s + p.prefill_s_per_token * tokens + busy


def true_tpot(p: LatencyPrior, kv: float) -> float:
    return p.decode_step_s + p.decode_s_per_kv_token * kv


def feed(est: LatencyEstimator, name: str, truth: LatencyPrior, rng: random.Random, n: int = 80) -> None:
    """`n` requests of random sizes on replica `name`, observed with +-5% noise."""
    for _ in range(n):
        uncached = rng.randint(100, 8000)
        r = state(name, in_flight=rng.randint(0, 8), in_flight_tokens=rng.randint(0, 200_000))
        ticket = est.predict(r, uncached, NOW, 1.0)
        est.dispatched(ticket)
        noise = rng.uniform(0.95, 1.05)
        est.prefilled(ticket)
        actual = true_ttft(truth, ticket.ahead_tokens + uncached, ticket.batch_kv_tokens)
        est.observe_ttft(ticket, actual * noise)
        est.observe_tpot(ticket, true_tpot(truth, ticket.batch_kv_tokens) * rng.uniform(0.95, 1.05))


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_converges_to_the_true_rates_from_priors_2x_off(factor: float) -> None:
    est = LatencyEstimator(16, default_prior=TRUE.scaled(factor))
    feed(est, "r", TRUE, random.Random(1))
    m = est.models()["r"]
    assert m.ttft.b / TTFT_X_TOKENS == pytest.approx(TRUE.prefill_s_per_token, rel=0.05)
    assert m.ttft.a == pytest.approx(TRUE.ttft_fixed_s, rel=0.25)
    assert m.tpot.a == pytest.approx(TRUE.decode_step_s, rel=0.1)
    assert m.tpot.b / TPOT_X_TOKENS == pytest.approx(TRUE.decode_s_per_kv_token, rel=0.2)
    for tokens in (500, 2000, 6000):
        assert est.ttft_s(state("r"), tokens, NOW, 1.0) == pytest.approx(true_ttft(TRUE, tokens), rel=0.05)
        busy = state("r", in_flight=4, in_flight_tokens=50_000)
        expected = true_ttft(TRUE, tokens, 50_000)
        assert est.ttft_s(busy, tokens, NOW, 1.0) == pytest.approx(expected, rel=0.05)


def test_replicas_of_different_speeds_are_calibrated_apart() -> None:
    est = LatencyEstimator(16, default_prior=TRUE)
    rng = random.Random(2)
    slow = TRUE.scaled(3.0)
    for _ in range(3):  # interleaved, as a fleet's observations come
        feed(est, "fast", TRUE, rng, n=30)
        feed(est, "slow", slow, rng, n=30)
    fast_t = est.ttft_s(state("fast"), 4000, NOW, 1.0)
    slow_t = est.ttft_s(state("slow"), 4000, NOW, 1.0)
    assert fast_t == pytest.approx(true_ttft(TRUE, 4000), rel=0.05)
    assert slow_t == pytest.approx(true_ttft(slow, 4000), rel=0.05)


def test_stale_inputs_do_not_calibrate() -> None:
    est = LatencyEstimator(16, default_prior=TRUE)
    stale = state("r", scraped_at=NOW - 30, waiting=50)
    for _ in range(20):
        ticket = est.predict(stale, 1000, NOW, 1.0)
        assert not ticket.fresh
        est.dispatched(ticket)
        est.prefilled(ticket)
        # 50 requests were waiting that the stale scrape hides: a TTFT 20x the prediction
        error = est.observe_ttft(ticket, ticket.ttft_s * 20)
        assert error == pytest.approx(0.95)  # still reported against the prediction
        assert not est.observe_tpot(ticket, 1.0)
    m = est.models()["r"]
    assert (m.ttft.a, m.ttft.b, m.ttft.observations) == (m.ttft.a0, m.ttft.b0, 0)
    assert m.tpot.observations == 0


def test_a_never_scraped_replica_does_not_calibrate() -> None:
    est = LatencyEstimator(16)
    ticket = est.predict(state("r", scraped_at=None), 1000, NOW, 1.0)
    assert not ticket.fresh
    est.observe_ttft(ticket, 5.0)
    assert est.models()["r"].ttft.observations == 0


def test_an_outlier_is_refused_but_a_lasting_change_is_followed() -> None:
    fit = LinearFit(0.02, 0.04)
    for x in (1.0, 2.0, 4.0, 3.0) * 10:
        fit.update(x, 0.02 + 0.04 * x)
    before = (fit.a, fit.b)
    assert not fit.update(2.0, 5.0)  # one absurd sample (a stalled client, a GC pause)
    assert (fit.a, fit.b) == before
    for x in (1.0, 2.0, 4.0, 3.0) * 20:  # the replica really became 3x slower
        fit.update(x, 3 * (0.02 + 0.04 * x))
    assert fit.predict(2.0) == pytest.approx(3 * (0.02 + 0.04 * 2.0), rel=0.1)


def test_coefficients_stay_within_bounds_of_the_prior() -> None:
    fit = LinearFit(0.02, 0.04, gate_after=0)
    for _ in range(50):
        fit.update(1.0, 1e-9)
    assert fit.a >= 0.02 / 20 and fit.b >= 0.04 / 20
    assert not fit.update(1.0, float("nan")) and not fit.update(1.0, 0.0)


def test_the_pending_ledger_and_the_scrape() -> None:
    est = LatencyEstimator(16, default_prior=TRUE)
    r = state("r")
    tickets = [est.predict(r, 2000, NOW, 1.0) for _ in range(3)]
    for t in tickets:
        est.dispatched(t)
    assert est.predict(r, 0, NOW, 1.0).ahead_tokens == 6000
    est.prefilled(tickets[0])
    assert est.predict(r, 0, NOW, 1.0).ahead_tokens == 4000
    # A fresh scrape showing 5 waiting (others' requests too) prices them at the mean uncached prompt.
    busy = state("r", waiting=5)
    assert est.predict(busy, 0, NOW, 1.0).ahead_tokens > 4000
    # The same scrape, stale: only kvgate's own ledger counts.
    assert est.predict(state("r", waiting=5, scraped_at=NOW - 5), 0, NOW, 1.0).ahead_tokens == 4000
    more = est.ttft_s(r, 1000, NOW, 1.0)
    for t in tickets[1:]:
        est.prefilled(t)
    assert est.ttft_s(r, 1000, NOW, 1.0) < more


def test_uncached_tokens_and_forget() -> None:
    est = LatencyEstimator(16)
    assert est.uncached_tokens(1000, 50) == 200
    assert est.uncached_tokens(1000, 80) == 0
    est.predict(state("r"), 10, NOW, 1.0)
    est.forget("r")
    assert "r" not in est.models()


def test_new_priors_restart_calibration() -> None:
    est = LatencyEstimator(16, default_prior=TRUE)
    feed(est, "r", TRUE.scaled(2), random.Random(3), n=10)
    est.set_priors({}, TRUE)
    assert "r" in est.models()  # the same priors: calibration kept
    est.set_priors({"m": TRUE.scaled(2)}, TRUE)
    assert est.models() == {}
    assert est.model("r", "m").prior == TRUE.scaled(2)


def test_prior_validation_and_roofline() -> None:
    with pytest.raises(ValueError, match="prefill_s_per_token"):
        LatencyPrior(prefill_s_per_token=0)
    p = LatencyPrior.from_roofline(s_per_token=1e-5, s_weights=0.005, s_per_kv_token=1e-8, overhead_s=0.001,
                                   time_scale=2.0)  # fmt: skip
    assert p == LatencyPrior(2e-5, 0.002, 0.012, 2e-8)


def test_prediction_is_a_plain_value() -> None:
    t = LatencyEstimator(16).predict(state("r"), 100, NOW, 1.0)
    assert isinstance(t, Prediction) and t.replica == "r" and t.pool == "m" and t.ttft_s > 0


def test_the_step_under_way_is_dated_by_the_last_chunk() -> None:
    est = LatencyEstimator(16, default_prior=TRUE)
    busy = state("r", in_flight=4, in_flight_tokens=50_000)
    step = true_tpot(TRUE, 50_000)
    undated = est.predict(busy, 500, NOW, 1.0)
    assert undated.wait_s == pytest.approx(0.5 * step)  # no chunk seen yet: half a step on average
    est.step_seen("r", NOW - 0.25 * step)
    dated = est.predict(busy, 500, NOW, 1.0)
    assert dated.wait_s == pytest.approx(0.75 * step)
    assert dated.ttft_s - undated.ttft_s == pytest.approx(0.25 * step)
    est.step_seen("r", NOW - 3 * step)  # overdue (a long step, or the stream ended): undated again
    assert est.predict(busy, 500, NOW, 1.0).wait_s == pytest.approx(0.5 * step)
    assert est.predict(state("r"), 500, NOW, 1.0).wait_s == 0.0  # idle: nothing under way
    # Calibration takes the prefill's own part: the predicted wait comes off the observation.
    est.dispatched(dated)
    est.prefilled(dated)
    est.observe_ttft(dated, dated.ttft_s)
    assert est.predict(busy, 500, NOW, 1.0).ttft_s == pytest.approx(undated.ttft_s, rel=0.01)


@pytest.mark.parametrize("work_weight", [0.0, 1.0])
def test_the_inlined_cost_is_the_model(work_weight: float) -> None:
    est = LatencyEstimator(16, default_prior=TRUE)
    rng = random.Random(4)
    feed(est, "r", TRUE.scaled(1.5), rng, n=20)
    for _ in range(50):
        scraped = NOW - rng.choice([0.1, 5.0])
        r = state("r", in_flight=rng.randint(0, 5), in_flight_tokens=rng.randint(0, 90_000),
                  running=rng.randint(0, 9), waiting=rng.randint(0, 3), scraped_at=scraped,
                  in_flight_at_scrape=rng.choice([None, rng.randint(0, 5)]))  # fmt: skip
        if rng.random() < 0.5:
            est.step_seen("r", NOW - rng.uniform(0, 0.02))
        held = rng.randint(0, 300)  # index blocks of 16 tokens
        own = est.uncached_tokens(4000, held)
        expected = est.ttft_s(r, own, NOW, 1.0) + work_weight * est.prefill_s(r, own)
        assert est.costs([r], 4000, {"r": held}, NOW, 1.0, work_weight)[0] == pytest.approx(expected)
