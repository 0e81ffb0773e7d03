"""The step under way: the prefill kvgate sent before it began is being computed in it (up to the
step's token budget), so it is not ahead of a new request but makes the step itself longer."""

import random

import pytest

from policies.latency.estimator import LatencyEstimator, Prediction
from policies.latency.prior import LatencyPrior
from policies.latency.replica_model import TPOT_X_TOKENS, TTFT_X_TOKENS, ReplicaLatencyModel
from policies.types import ReplicaState

NOW = 100.0
PRIOR = LatencyPrior(
    prefill_s_per_token=4e-5, ttft_fixed_s=0.002, decode_step_s=0.01, decode_s_per_kv_token=1e-7,
    step_tokens=5000,
)  # fmt: skip
BUSY = 50_000  # in-flight KV tokens: the replica is running something


def state(**fields: object) -> ReplicaState:
    values: dict[str, object] = {
        "url": "http://r", "pool": "m", "scraped_at": NOW, "in_flight": 3, "in_flight_tokens": BUSY,
    }  # fmt: skip
    values.update(fields)
    return ReplicaState(name="r", **values)  # type: ignore[arg-type]


def prefill(tokens: float) -> float:
    return PRIOR.ttft_fixed_s + PRIOR.prefill_s_per_token * tokens


def decode_step(kv: float = BUSY) -> float:
    return PRIOR.decode_step_s + PRIOR.decode_s_per_kv_token * kv


def send(est: LatencyEstimator, tokens: int, at: float) -> Prediction:
    ticket = est.predict(state(), tokens, at, 1.0)
    est.dispatched(ticket)
    return ticket


def test_a_prefill_sent_before_the_step_began_is_under_way_not_ahead() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    send(est, 4000, NOW - 0.05)
    est.step_seen("r", NOW - 0.04)  # the step under way began after that dispatch: it computes it
    p = est.predict(state(), 300, NOW, 1.0)
    assert p.ahead_tokens == 0
    # The step lasts the 4,000 tokens' prefill (longer than a decode step) from when it began.
    assert p.wait_s == pytest.approx(prefill(4000) - 0.04)
    assert p.ttft_s == pytest.approx(p.wait_s + prefill(300))
    # Sent after the step began: it waits for the next step, so it is ahead of a later request.
    send(est, 1000, NOW - 0.03)
    later = est.predict(state(), 300, NOW, 1.0)
    assert later.ahead_tokens == 1000
    assert later.wait_s == pytest.approx(p.wait_s)
    assert later.ttft_s == pytest.approx(p.wait_s + prefill(1300))


def test_the_step_under_way_computes_at_most_its_token_budget() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    send(est, 4000, NOW - 0.06)
    send(est, 3000, NOW - 0.05)  # 7,000 sent before the step: 5,000 fit in it, 2,000 are left
    est.step_seen("r", NOW - 0.04)
    p = est.predict(state(), 300, NOW, 1.0)
    assert p.ahead_tokens == 2000
    assert p.wait_s == pytest.approx(prefill(PRIOR.step_tokens) - 0.04)


def test_a_fresh_scrape_showing_requests_waiting_takes_nothing_as_under_way() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    send(est, 4000, NOW - 0.005)
    est.step_seen("r", NOW - 0.004)
    # The replica holds requests back (no free KV blocks): the 4,000 may be among those waiting.
    holding = est.predict(state(waiting=1), 300, NOW, 1.0)
    assert holding.ahead_tokens == 4000
    assert holding.wait_s == pytest.approx(decode_step() - 0.004)  # a decode step under way
    # The same scrape, stale: the ledger and the step's date decide.
    stale = est.predict(state(waiting=1, scraped_at=NOW - 5), 300, NOW, 1.0)
    assert stale.ahead_tokens == 0


def test_a_small_prefill_under_way_lasts_a_decode_step_and_an_overdue_step_half_of_one() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    send(est, 10, NOW - 0.005)
    est.step_seen("r", NOW - 0.004)
    assert est.predict(state(), 300, NOW, 1.0).wait_s == pytest.approx(decode_step() - 0.004)
    est.step_seen("r", NOW - 1.0)  # long ago: the step is overdue, when it ends is unknown
    assert est.predict(state(), 300, NOW, 1.0).wait_s == pytest.approx(0.5 * decode_step())


def test_the_ledger_lets_go_of_the_request_that_got_its_first_token() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    a = send(est, 4000, NOW - 0.05)
    send(est, 1000, NOW - 0.045)
    est.step_seen("r", NOW - 0.04)
    assert est.predict(state(), 0, NOW, 1.0).wait_s == pytest.approx(prefill(5000) - 0.04)
    est.prefilled(a)  # a's first token came: the 1,000 sent after it is what the step computes
    assert est.predict(state(), 0, NOW, 1.0).wait_s == pytest.approx(prefill(1000) - 0.04)
    assert est.models()["r"].pending_tokens == 1000
    est.prefilled(a)  # a second time (a caller's mistake): the counts say nothing is pending now,
    assert est.models()["r"].pending_tokens == 0  # and the ledger follows them
    assert est.models()["r"].in_step_tokens(state(), True) == 0


def test_a_dispatch_not_dated_is_never_under_way() -> None:
    model = ReplicaLatencyModel(PRIOR)
    model.dispatched(4000)  # no time given: as the model was before dispatches were dated
    model.last_step_at = NOW
    assert model.in_step_tokens(state(), True) == 0
    assert model.tokens_ahead(state(), True, NOW) == 4000
    model.prefilled(4000)
    assert model.tokens_ahead(state(), True, NOW) == 0


@pytest.mark.parametrize("work_weight", [0.0, 1.0])
def test_the_inlined_cost_is_the_model_with_prefill_under_way(work_weight: float) -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    rng = random.Random(5)
    tickets: list[Prediction] = []
    for _ in range(60):
        at = NOW - rng.uniform(0, 0.2)
        if rng.random() < 0.6 or not tickets:
            tickets.append(send(est, rng.randint(0, 3000), min(at, NOW)))
        else:
            est.prefilled(tickets.pop(rng.randrange(len(tickets))))
        est.step_seen("r", NOW - rng.uniform(0, 0.15))
        r = state(in_flight=rng.randint(0, 5), in_flight_tokens=rng.choice([0, rng.randint(1, 90_000)]),
                  running=rng.randint(0, 9), waiting=rng.choice([0, 0, 2]),
                  in_flight_at_scrape=rng.choice([None, rng.randint(0, 5)]),
                  scraped_at=NOW - rng.choice([0.1, 5.0]))  # fmt: skip
        held = rng.randint(0, 300)
        own = est.uncached_tokens(4000, held)
        expected = est.ttft_s(r, own, NOW, 1.0) + work_weight * est.prefill_s(r, own)
        assert est.costs([r], 4000, {"r": held}, NOW, 1.0, work_weight)[0] == pytest.approx(expected)


def test_the_step_budget_is_part_of_the_prior() -> None:
    assert LatencyPrior().step_tokens == 8192  # vLLM's --max-num-batched-tokens default
    with pytest.raises(ValueError, match="step_tokens"):
        LatencyPrior(step_tokens=0)
    assert PRIOR.scaled(2.0).step_tokens == PRIOR.step_tokens  # slower, not a smaller budget
    assert TTFT_X_TOKENS == 1000.0 and TPOT_X_TOKENS == 100_000.0  # the units prefill/decode_step use


def test_a_request_still_waiting_after_a_whole_step_means_the_replica_holds_requests_back() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    send(est, 4000, NOW - 0.2)
    est.step_seen("r", NOW - 0.15)  # a step began after the dispatch: it should have computed it
    assert est.predict(state(), 300, NOW, 1.0).ahead_tokens == 0  # (so far: under way)
    est.step_seen("r", NOW - 0.01)  # that step ended and another began: still no first token
    held = est.predict(state(), 300, NOW, 1.0)
    assert held.ahead_tokens == 4000  # waiting for KV blocks: ahead, not under way
    assert held.wait_s == pytest.approx(decode_step() - 0.01)


def test_a_prompt_longer_than_a_step_is_not_taken_as_held_back() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    send(est, 9000, NOW - 0.3)  # 9,000 > 5,000 a step: chunked over two steps, the second under way
    est.step_seen("r", NOW - 0.25)
    est.step_seen("r", NOW - 0.04)
    # Not held back: one budget of it is taken as under way (how far a chunked prompt got in the
    # steps before is not tracked, so the rest counts as ahead).
    assert est.predict(state(), 300, NOW, 1.0).ahead_tokens == 9000 - PRIOR.step_tokens


def test_chunks_of_one_step_date_it_once() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    send(est, 4000, NOW - 0.2)
    est.step_seen("r", NOW - 0.04)
    for lag in (0.0005, 0.001):  # other streams' chunks of the same step, relayed just after
        est.step_seen("r", NOW - 0.04 + lag)
    p = est.predict(state(), 300, NOW, 1.0)
    assert p.ahead_tokens == 0  # the previous step is not those chunks: the 4,000 is under way
    assert p.wait_s == pytest.approx(prefill(4000) - 0.04)  # dated by the step's first chunk


def test_letting_go_without_the_dispatch_time_keeps_the_ledger_consistent() -> None:
    model = ReplicaLatencyModel(PRIOR)
    model.dispatched(4000, NOW - 0.05)
    model.dispatched(1000, NOW - 0.045)
    model.last_step_at = NOW - 0.04
    assert model.in_step_tokens(state(), True) == 5000
    model.prefilled(4000)  # a caller that kept only the size: the oldest request of that size goes
    assert model.in_step_tokens(state(), True) == 1000
    model.prefilled(777)  # a size never sent: the counts still drop, and the ledger follows them
    assert model.pending_requests == 0 and model.in_step_tokens(state(), True) == 0
    assert model.tokens_ahead(state(), True, NOW) == 0


def test_a_due_request_leaves_both_the_counts_and_the_dated_ledger() -> None:
    # A non-streaming request (due at its predicted TTFT) dispatched before the step under way: it is
    # under way until it is due, then it leaves the counts and the dated ledger together.
    model = ReplicaLatencyModel(LatencyPrior())
    model.dispatched(1000, NOW - 0.2, NOW + 1.0)
    model.dispatched(500, NOW - 0.1)
    model.last_step_at = NOW
    assert model.in_step_tokens(state(), True) == 1500
    assert model.tokens_ahead(state(), True, NOW + 1.5) == 0  # what is left is under way
    assert model.pending_requests == 1 and model.in_step_tokens(state(), True) == 500
    model.prefilled(1000, NOW - 0.2, NOW + 1.0)  # its end, after it was due: nothing more leaves
    assert model.pending_requests == 1 and model.pending_tokens == 500


def test_a_request_of_kvgate_s_that_ended_after_the_scrape_is_not_another_sender_s() -> None:
    """Closed loop at one stream per replica: the scrape saw kvgate's request running, it ended, and
    the client's next one arrives before the next scrape. The replica is idle: no batch, no step
    under way. Only requests running beyond kvgate's own at the scrape are another sender's."""
    est = LatencyEstimator(16, default_prior=PRIOR)
    est.prefilled(send(est, 300, NOW - 0.5))  # (a mean prompt to price another sender's request at)
    est.step_seen("r", NOW - 0.001)  # the ended request's last chunk, just now
    idle = state(in_flight=0, in_flight_tokens=0, running=0)
    after_own = state(in_flight=0, in_flight_tokens=0, running=1, in_flight_at_scrape=1)
    beside_other = state(in_flight=0, in_flight_tokens=0, running=1, in_flight_at_scrape=0)
    old_rule = state(in_flight=0, in_flight_tokens=0, running=1)  # not known: compared with in_flight
    predict = lambda r: est.predict(r, 300, NOW, 1.0)  # noqa: E731
    assert predict(after_own).ttft_s == predict(idle).ttft_s == prefill(300)
    assert predict(after_own).batch_kv_tokens == 0.0 and predict(after_own).wait_s == 0.0
    for busy in (beside_other, old_rule):
        assert predict(busy).batch_kv_tokens > 0 and predict(busy).wait_s > 0
        assert predict(busy).ttft_s > prefill(300)
    assert predict(beside_other).batch_kv_tokens == 300.0  # priced at the mean uncached prompt
    # Two of kvgate's at the scrape, one since ended, one still running, and one of another's: the
    # batch is kvgate's one and the other's (priced as kvgate's).
    mixed = state(in_flight=1, in_flight_tokens=4000, running=3, in_flight_at_scrape=2)
    assert est.predict(mixed, 300, NOW, 1.0).batch_kv_tokens == 8000.0
    # A stale scrape counts nobody else's.
    stale = state(in_flight=0, in_flight_tokens=0, running=5, in_flight_at_scrape=0, scraped_at=NOW - 9)
    assert predict(stale).batch_kv_tokens == 0.0
