"""The pending-prefill ledger for requests that report no first token (non-streaming answers): their
tokens leave by themselves when their prefill is predicted done, read against `now`; an answer that
ends sooner leaves then; each leaves exactly once; and none of it calibrates the TTFT model."""

from policies.latency.estimator import LatencyEstimator
from policies.latency.prior import LatencyPrior
from policies.types import ReplicaState

NOW = 100.0
PRIOR = LatencyPrior(
    prefill_s_per_token=4e-5, ttft_fixed_s=0.02, decode_step_s=0.01, decode_s_per_kv_token=1e-7
)


def idle(name: str = "r") -> ReplicaState:
    return ReplicaState(name=name, url=f"http://{name}", pool="m", scraped_at=NOW)


def test_a_non_streaming_dispatch_leaves_the_ledger_when_its_prefill_is_predicted_done() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    r = idle()
    ticket = est.dispatched(est.predict(r, 2000, NOW, 1.0), now=NOW)
    assert ticket.due_at == NOW + ticket.ttft_s  # 0.02 + 2,000 x 4e-5 = 0.1 s
    assert est.predict(r, 0, NOW, 1.0).ahead_tokens == 2000
    just_before = NOW + ticket.ttft_s * 0.99
    assert est.predict(r, 0, just_before, 1.0).ahead_tokens == 2000
    assert est.ttft_s(r, 1000, just_before, 1.0) > est.unloaded_ttft_s(r, 1000) * 2
    due = NOW + ticket.ttft_s
    assert est.predict(r, 0, due, 1.0).ahead_tokens == 0
    assert est.ttft_s(r, 1000, due, 1.0) == est.unloaded_ttft_s(r, 1000)
    m = est.models()["r"]
    assert (m.pending_tokens, m.pending_requests) == (0, 0)
    est.prefilled(ticket)  # the answer ends later: it has left already, nothing else goes with it
    assert (m.pending_tokens, m.pending_requests) == (0, 0)
    assert m.ttft.observations == 0


def test_the_scorers_cost_reads_the_ledger_against_now_too() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    r = idle()
    ticket = est.dispatched(est.predict(r, 4000, NOW, 1.0), now=NOW)
    before = est.costs([r], 1000, {}, NOW, 1.0)[0]
    after = est.costs([r], 1000, {}, NOW + ticket.ttft_s, 1.0)[0]
    assert before - after > 4000 * 4e-5 * 0.9
    assert after == est.unloaded_ttft_s(r, 1000)


def test_an_answer_that_ends_before_it_is_due_leaves_then_and_only_once() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    r = idle()
    quick = est.dispatched(est.predict(r, 3000, NOW, 1.0), now=NOW)
    twin = est.dispatched(est.predict(r, 3000, NOW, 1.0), now=NOW)  # the same prediction, one later
    streaming = est.dispatched(est.predict(r, 500, NOW, 1.0))  # reports a first token: no due time
    assert streaming.due_at is None
    assert est.predict(r, 0, NOW, 1.0).ahead_tokens == 6500
    est.prefilled(quick)  # an error before any prefill was done, say
    assert est.predict(r, 0, NOW, 1.0).ahead_tokens == 3500
    late = max(quick.due_at or 0.0, twin.due_at or 0.0) + 1.0
    assert est.predict(r, 0, late, 1.0).ahead_tokens == 500  # the twin is due; the stream is not
    est.prefilled(twin)
    est.prefilled(quick)  # called again by mistake: the ledger does not go below what is left
    m = est.models()["r"]
    assert (m.pending_tokens, m.pending_requests) == (500, 1)
    est.prefilled(streaming)
    assert (m.pending_tokens, m.pending_requests) == (0, 0)


def test_entries_fall_due_in_order_of_their_due_times() -> None:
    est = LatencyEstimator(16, default_prior=PRIOR)
    r = idle()
    small = est.dispatched(est.predict(r, 500, NOW, 1.0), now=NOW)  # 0.04 s
    big = est.dispatched(est.predict(idle(), 8000, NOW - 0.05, 1.0), now=NOW - 0.05)  # due at +0.29
    assert small.due_at is not None and big.due_at is not None and small.due_at < big.due_at
    assert est.predict(r, 0, small.due_at, 1.0).ahead_tokens == 8000
    assert est.predict(r, 0, big.due_at, 1.0).ahead_tokens == 0
