"""Requests that join a request's step after it was dispatched: the follow-ups a closed-loop client
sends when its stream ends (expected in the ticket), and those seen to join (taken out of the TTFT
fit's calibration, so that it does not absorb them as a slower prefill)."""

import pytest

from policies.latency.estimator import LatencyEstimator, Prediction
from policies.latency.follow_ups import _MAX_BATCH, FollowUpCredits, Joiners
from policies.latency.prior import LatencyPrior
from policies.latency.replica_model import TTFT_X_TOKENS
from policies.latency.rls import LinearFit
from policies.types import ReplicaState

PRIOR = LatencyPrior(
    prefill_s_per_token=4e-5, ttft_fixed_s=0.002, decode_step_s=0.01, decode_s_per_kv_token=1e-7,
)  # fmt: skip
BUSY = 50_000  # in-flight KV tokens: the replica is running something


def state(name: str = "r", in_flight_tokens: int = BUSY) -> ReplicaState:
    return ReplicaState(name=name, url=f"http://{name}", pool="m", scraped_at=0.0, in_flight=3,
                        in_flight_tokens=in_flight_tokens)  # fmt: skip


def send(est: LatencyEstimator, now: float, uncached: int = 300, name: str = "r") -> Prediction:
    return est.dispatched(est.predict(state(name), uncached, now, 1e9))


def test_credits_expire_and_are_taken_oldest_first() -> None:
    credits = FollowUpCredits()
    assert credits.owed(0.0) == 0 and credits.take() == -1 and credits.newest == -1
    credits.ended(1.0)
    credits.ended(2.0)
    credits.ended(3.0)
    assert credits.newest == 2
    assert credits.owed(0.5) == 3
    assert credits.owed(1.5) == 2  # the first expired
    assert credits.take() == 1  # the oldest left
    assert credits.owed(2.5) == 1
    assert credits.take() == 2 and credits.take() == -1


def test_joiners_calibrate_the_share_of_owed_follow_ups_that_join_and_their_size() -> None:
    joiners = Joiners()
    assert joiners.expected_tokens(3) == 0.0  # nothing learned: no term
    # A step's batch: the first was dispatched with 2 follow-ups owed (credits 0 and 1, newest 1),
    # which came next (took 0 and 1); a fourth came from a later credit (2): it joined the step, but
    # was not owed to the first.
    joiners.dispatched(1, 300, 2, True, -1, 1)
    joiners.dispatched(2, 200, 1, True, 0, 1)
    joiners.dispatched(3, 100, 0, True, 1, 1)
    joiners.dispatched(4, 700, 0, True, 2, 2)
    joiners.step_began()
    # Owed 2 + 1 = 3, all joined: 200 + 100 (to the first) + 100 (to the second), 400 / 3 each.
    assert joiners.share == pytest.approx(1.0)
    assert joiners.expected_tokens(0) == 0.0
    assert joiners.expected_tokens(3) == pytest.approx(400)
    # Seen: every request dispatched after one before its step began joined it, owed or not.
    assert joiners.seen == {1: 1000, 2: 800, 3: 700, 4: 0}
    joiners.step_began()  # an empty step changes nothing
    assert joiners.share == pytest.approx(1.0)


def test_a_follow_up_that_probably_does_not_join_is_not_expected() -> None:
    joiners = Joiners()
    # Owed 3 (credits 0-2), of which one came here before the step began: the others went elsewhere.
    joiners.dispatched(1, 300, 3, True, -1, 2)
    joiners.dispatched(2, 600, 0, True, 0, 2)
    joiners.step_began()
    assert joiners.share == pytest.approx(1 / 3)
    assert joiners.expected_tokens(2) == 0.0  # 2/3 of a follow-up: more likely none
    assert joiners.expected_tokens(3) == pytest.approx(600)  # one whole follow-up, of the size seen
    assert joiners.expected_tokens(7) == pytest.approx(1200)


def test_a_request_sent_to_an_idle_replica_calibrates_nothing() -> None:
    joiners = Joiners()
    joiners.dispatched(1, 300, 2, False, -1, 1)  # idle: its step began with it alone
    joiners.dispatched(2, 300, 1, True, 0, 1)
    joiners.dispatched(3, 300, 0, True, 1, 1)
    joiners.step_began()
    assert joiners.share == pytest.approx(1.0)  # the second's owed only: 1 of 1
    assert joiners.seen[1] == 0


def test_without_steps_seen_the_requests_kept_are_bounded() -> None:
    joiners = Joiners()  # a replica serving only non-streaming answers: no chunk dates a step
    for ident in range(3 * _MAX_BATCH):
        joiners.dispatched(ident, 100, 1, True, ident, ident + 1)
    joiners.step_began()
    assert len(joiners.seen) <= _MAX_BATCH


def burst(est: LatencyEstimator, now: float, size: int) -> list[Prediction]:
    """`size` streams end on replica "r" at `now` and their clients send their next requests there at
    once; the step that computes them begins just after."""
    tickets = [send(est, now - 1.0) for _ in range(size)]
    est.step_seen("r", now - 0.5)
    for p in tickets:
        est.prefilled(p)
        est.ended(p, now)
    follow = [send(est, now) for _ in range(size)]
    est.step_seen("r", now + 0.001)  # their step began
    for p in follow:
        est.prefilled(p)
        est.ended(p)  # no time: no follow-up expected from these
    return follow


def test_the_first_of_a_burst_of_follow_ups_expects_the_rest_to_join_its_step() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    first = burst(est, 10.0, 4)
    assert [p.owed for p in first] == [3, 2, 1, 0]
    assert all(p.joined_tokens == 0 for p in first)  # nothing learned yet
    later = burst(est, 20.0, 4)
    # Every owed follow-up joined: 300 tokens each.
    assert [p.joined_tokens for p in later] == pytest.approx([900, 600, 300, 0])
    # Predicted as a batch: each with the burst's other 900 tokens, ahead of it or expected to join.
    assert [p.ahead_tokens for p in later] == [0, 300, 600, 900]
    assert [p.ttft_s for p in later] == pytest.approx([later[3].ttft_s] * 4)
    model = est.model("r", "m")
    assert later[0].ttft_s == pytest.approx(model.ttft_s(900, 300, BUSY, later[0].wait_s))


def test_follow_ups_expire_after_a_decode_step_and_skip_an_idle_replica() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    burst(est, 10.0, 3)
    ended = [send(est, 19.0) for _ in range(3)]
    for p in ended:
        est.prefilled(p)
        est.ended(p, 20.0)
    idle = est.predict(state(in_flight_tokens=0), 300, 20.0, 1e9)
    assert idle.owed == 2 and idle.joined_tokens == 0  # an idle replica begins a step with it alone
    busy = est.predict(state(), 300, 20.0, 1e9)
    assert busy.owed == 2 and busy.joined_tokens == pytest.approx(600)
    step = est.model("r", "m").tpot.a
    late = est.predict(state(), 300, 20.0 + 2 * step, 1e9)  # the clients did not come back in time
    assert late.owed == 0 and late.joined_tokens == 0


def test_the_ttft_fit_calibrates_with_the_requests_that_joined_the_step() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    p = send(est, 1.0, 500)
    send(est, 1.0, 2000)  # dispatched after it, before its step began: computed with it
    est.step_seen("r", 1.005)
    est.prefilled(p)
    ttft = p.wait_s + 0.09
    assert est.model("r", "m").ttft.observations == 0
    est.observe_ttft(p, ttft)
    reference = LinearFit(PRIOR.ttft_fixed_s, PRIOR.prefill_s_per_token * TTFT_X_TOKENS)
    assert reference.update((p.ahead_tokens + 2000 + 500) / TTFT_X_TOKENS, ttft - p.wait_s)
    fit = est.model("r", "m").ttft
    for x in (0.0, 1.0, 5.0):
        assert fit.predict(x) == pytest.approx(reference.predict(x))
    # Without the joiner the same TTFT teaches a slower prefill.
    alone = LatencyEstimator(16, default_prior=PRIOR)
    q = send(alone, 1.0, 500)
    alone.step_seen("r", 1.005)
    alone.prefilled(q)
    alone.observe_ttft(q, ttft)
    assert alone.model("r", "m").ttft.observations == 1
    assert alone.model("r", "m").ttft.predict(0.5) > fit.predict(0.5)


def test_a_request_that_ended_before_its_step_neither_joins_it_nor_stays_behind() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    first = send(est, 1.0, 500)
    failed = send(est, 1.0, 2000)  # dispatched after it, then failed before any step was seen
    est.prefilled(failed)
    est.ended(failed, 1.001)
    est.step_seen("r", 1.005)
    joiners = est._joiners["r"]
    assert failed.ident not in joiners.seen  # nobody will take it: it must not be kept
    assert joiners.seen[first.ident] == 0  # and it did not join the first one's step
    est.prefilled(first)
    est.ended(first)
    assert joiners.seen == {}
