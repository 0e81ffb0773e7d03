"""`LatencyStore`: the ledger, the error metric per replica and pool, forgetting, and reload's priors."""

from __future__ import annotations

import random

from gateway.config import parse_config
from gateway.latency_store import LatencyStore
from gateway.metrics import GatewayMetrics
from gateway.routing import Router
from policies.latency.estimator import LatencyEstimator
from policies.types import ReplicaState

NOW = 50.0
NAME = "kvgate_ttft_prediction_error_ratio"


def state(name: str) -> ReplicaState:
    return ReplicaState(name=name, url=f"http://{name}", pool="m", scraped_at=NOW)


def test_first_token_observes_the_error_and_forget_drops_the_series() -> None:
    metrics = GatewayMetrics()
    est = LatencyEstimator(64)
    store = LatencyStore(est, metrics)
    ticket = store.dispatch(est.predict(state("r0"), 2000, NOW, 1.0))
    assert est.models()["r0"].pending_tokens == 2000
    error = store.first_token(ticket, ticket.ttft_s * 2)
    assert error == 0.5
    assert est.models()["r0"].pending_tokens == 0
    labels = {"replica": "r0", "pool": "m"}
    assert metrics.registry.get_sample_value(f"{NAME}_count", labels) == 1
    assert metrics.registry.get_sample_value(f"{NAME}_bucket", {**labels, "le": "0.5"}) == 1
    store.ended(ticket, True, 0.01)
    store.forget("r0")
    assert "r0" not in est.models()
    assert metrics.registry.get_sample_value(f"{NAME}_count", labels) is None


def test_an_attempt_without_a_first_token_leaves_the_ledger() -> None:
    est = LatencyEstimator(64)
    store = LatencyStore(est)
    ticket = store.dispatch(est.predict(state("r0"), 700, NOW, 1.0))
    store.ended(ticket, False)
    assert est.models()["r0"].pending_tokens == 0 and est.models()["r0"].pending_requests == 0


def test_an_end_dated_by_the_proxy_leaves_a_follow_up_expected() -> None:
    est = LatencyEstimator(64)
    store = LatencyStore(est)
    tickets = [store.dispatch(est.predict(state("r0"), 700, NOW, 1.0)) for _ in range(3)]
    for ticket in tickets[:2]:
        store.first_token(ticket, 0.05)
        store.ended(ticket, True, 0.01, NOW + 1.0)  # dated: its client may send its next request
    store.first_token(tickets[2], 0.05)
    store.ended(tickets[2], True, 0.01)  # not dated: nothing expected
    # Two follow-ups expected: the next request is one, the other is still to come.
    assert est.predict(state("r0"), 700, NOW + 1.0, 1.0).owed == 1


def test_an_attempt_that_failed_before_its_first_token_expects_no_follow_up() -> None:
    est = LatencyEstimator(64)
    store = LatencyStore(est)
    answered = [store.dispatch(est.predict(state("r0"), 700, NOW, 1.0)) for _ in range(2)]
    failed = store.dispatch(est.predict(state("r0"), 700, NOW, 1.0))
    store.ended(failed, False, None, NOW + 1.0)  # refused or broken: kvgate retries, no client answered
    assert est.predict(state("r0"), 700, NOW + 1.0, 1.0).owed == 0
    for ticket in answered:
        store.first_token(ticket, 0.05)
        store.ended(ticket, True, 0.01, NOW + 1.0)
    # Two follow-ups expected (the answered ones'), not three: the next request is one of them.
    assert est.predict(state("r0"), 700, NOW + 1.0, 1.0).owed == 1


def test_a_reload_with_new_priors_starts_the_replicas_over() -> None:
    replicas = [{"url": "http://127.0.0.1:9", "model": "m", "name": "r0"}]
    old = parse_config({"replicas": replicas})
    pool = {"name": "m", "latency_prior": {"profile": "tiny"}}
    new = parse_config({"replicas": replicas, "models": [pool]})
    router = Router(old, random.Random(0))
    router.latency.model("r0", "m")
    router.prepare(old, old).commit()
    assert "r0" in router.latency.models()  # the same priors: calibration kept
    router.prepare(old, new).commit()
    assert router.latency.models() == {}
    prior = new.models[0].latency_prior
    assert prior is not None and router.latency.model("r0", "m").prior == prior.prior()


def test_ended_drops_the_request_from_the_kv_ledger_with_or_without_a_first_token() -> None:
    est = LatencyEstimator(64)
    store = LatencyStore(est)
    streamed = store.dispatch(est.predict(state("r0"), 700, NOW, 1.0, prompt_tokens=700, output_tokens=8))
    failed = store.dispatch(est.predict(state("r0"), 700, NOW, 1.0, prompt_tokens=700, output_tokens=8))
    assert est.kv_in_flight("r0") == 2
    store.first_token(streamed, 0.05)
    assert est.kv_in_flight("r0") == 2  # running: it holds its blocks until it ends
    store.ended(streamed, True, 0.01)
    store.ended(failed, False)
    assert est.kv_in_flight("r0") == 0
