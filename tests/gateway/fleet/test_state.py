"""gateway/fleet/state.py with an injected clock: snapshot caching, accounting, health, models, listeners."""

from __future__ import annotations

import pytest

from gateway.config import FleetConfig, ReplicaConfig
from gateway.fleet.metrics_parse import ReplicaMetrics, parse_metrics
from gateway.fleet.models_parse import ServedModels, parse_models
from gateway.fleet.state import FleetChange, FleetState
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES
FLEET = FleetConfig(eject_after_failures=2, eject_backoff_s=1.0, eject_backoff_max_s=8.0, stale_after_s=1.0)
REPLICAS = (
    ReplicaConfig(url="http://10.0.0.1:8000", model="tiny-llama"),
    ReplicaConfig(url="http://10.0.0.2:8000", model="tiny-llama", name="b"),
    ReplicaConfig(url="http://10.0.0.3:8000", model="other", name="c"),
)
A, B, C = "10.0.0.1:8000", "b", "c"
METRICS = ReplicaMetrics(running=1, waiting=2, kv_usage=0.25)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state(clock: FakeClock) -> FleetState:
    return FleetState(REPLICAS, FLEET, clock)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, FleetChange]] = []

    def __call__(self, replica: str, change: FleetChange) -> None:
        self.events.append((replica, change))


def test_replicas_in_config_order(state: FleetState) -> None:
    assert state.names() == (A, B, C)
    assert [r.name for r in state.snapshot().replicas] == [A, B, C]
    assert [r.pool for r in state.snapshot().replicas] == ["tiny-llama", "tiny-llama", "other"]


def test_snapshot_is_the_same_object_until_something_changes(state: FleetState, clock: FakeClock) -> None:
    first = state.snapshot()
    clock.now += 5
    assert state.snapshot() is first  # time passing alone changes nothing
    state.dispatched(B, 10)
    second = state.snapshot()
    assert second is not first
    assert second.taken_at == clock.now
    # only the changed replica's state was rebuilt
    assert second.replicas[0] is first.replicas[0] and second.replicas[2] is first.replicas[2]
    assert second.replicas[1].in_flight == 1
    assert state.snapshot() is second


def test_in_flight_accounting(state: FleetState) -> None:
    state.dispatched(A, 300)
    state.dispatched(A, 200)
    state.dispatched(C, 50)
    r = state.snapshot().by_name(A)
    assert r is not None and (r.in_flight, r.in_flight_tokens) == (2, 500)
    state.finished(A, 300)
    state.finished(A, 200)
    state.finished(A, 200)  # unpaired: clamped, never negative
    r = state.snapshot().by_name(A)
    assert r is not None and (r.in_flight, r.in_flight_tokens) == (0, 0)
    c = state.snapshot().by_name(C)
    assert c is not None and (c.in_flight, c.in_flight_tokens) == (1, 50)


def test_each_scrape_keeps_kvgate_s_in_flight_count_at_that_moment(state: FleetState) -> None:
    """The scrape's running beyond it are other senders' (policies.types.ReplicaState): a request
    that ends after the scrape leaves the count as the scrape saw it."""
    assert state.snapshot().by_name(A).in_flight_at_scrape == 0  # type: ignore[union-attr]
    state.dispatched(A, 300)
    state.dispatched(A, 200)
    state.record_scrape(A, METRICS)
    state.finished(A, 300)
    r = state.snapshot().by_name(A)
    assert r is not None and (r.in_flight, r.in_flight_at_scrape, r.running) == (1, 2, 1)
    state.record_scrape(A, METRICS)
    r = state.snapshot().by_name(A)
    assert r is not None and r.in_flight_at_scrape == 1


def test_scrape_freshness_and_staleness(state: FleetState, clock: FakeClock) -> None:
    assert not state.snapshot().replicas[0].is_fresh(clock.now, FLEET.stale_after_s)
    assert state.scrape_age_s(A) is None
    state.record_scrape(A, METRICS)
    r = state.snapshot().replicas[0]
    assert (r.scraped_at, r.running, r.waiting, r.kv_usage) == (100.0, 1, 2, 0.25)
    assert r.is_fresh(clock.now, FLEET.stale_after_s)
    clock.now += 1.5  # scrapes stopped coming
    assert state.scrape_age_s(A) == 1.5
    assert not state.snapshot().replicas[0].is_fresh(clock.now, FLEET.stale_after_s)


def test_soft_failures_eject_at_threshold_and_snapshot_shows_it(state: FleetState, clock: FakeClock) -> None:
    state.record_scrape(A, METRICS)
    state.report_failure(A, "timeout")
    assert state.snapshot().replicas[0].healthy
    state.report_failure(A, "status_5xx")
    assert not state.snapshot().replicas[0].healthy
    clock.now += 0.5
    state.record_scrape(A, METRICS)  # success within the backoff: still out
    assert not state.snapshot().replicas[0].healthy
    clock.now += 0.5
    state.record_scrape(A, METRICS)
    assert state.snapshot().replicas[0].healthy


def test_connect_error_ejects_at_once(state: FleetState) -> None:
    state.report_failure(B, "connect")
    assert [r.healthy for r in state.snapshot().replicas] == [True, False, True]


def test_backoff_doubles_and_caps(state: FleetState, clock: FakeClock) -> None:
    state.report_failure(A, "connect")
    spans = [1.0, 2.0, 4.0, 8.0, 8.0]  # base 1 s doubling per failed probe, capped at 8 s
    for i, span in enumerate(spans):
        ejected_at = clock.now
        clock.now = ejected_at + span - 0.01
        state.record_scrape(A, METRICS)  # a success just before the backoff ends: still out
        assert not state.snapshot().replicas[0].healthy
        clock.now = ejected_at + span
        if i < len(spans) - 1:
            state.report_failure(A, "timeout")  # the probe after the backoff fails
            assert not state.snapshot().replicas[0].healthy
    state.record_scrape(A, METRICS)
    assert state.snapshot().replicas[0].healthy


def test_health_check_failure_blocks_scrape_readmission(state: FleetState, clock: FakeClock) -> None:
    recorder = Recorder()
    state.add_listener(recorder)
    state.record_health(C, ok=False)
    assert not state.snapshot().replicas[2].healthy
    clock.now += 5
    state.record_scrape(C, METRICS)
    assert not state.snapshot().replicas[2].healthy
    state.record_health(C, ok=True)
    assert state.snapshot().replicas[2].healthy
    health = [e for e in recorder.events if e[1] & FleetChange.HEALTH]
    assert health == [(C, FleetChange.HEALTH), (C, FleetChange.HEALTH)]


def test_listeners_hear_metrics_capacity_models_health_and_release(state: FleetState) -> None:
    recorder = Recorder()
    state.add_listener(recorder)
    page = parse_metrics((FIXTURES / "metrics_lora_under_load.txt").read_text())
    state.record_scrape(A, page)
    state.record_scrape(A, page)
    state.dispatched(A, 10)  # dispatch is not announced
    state.finished(A, 10)
    state.report_failure(A, "connect")
    assert recorder.events == [
        (A, FleetChange.METRICS | FleetChange.CAPACITY | FleetChange.MODELS),
        (A, FleetChange.METRICS),
        (A, FleetChange.RELEASED),
        (A, FleetChange.HEALTH),
    ]
    state.remove_listener(recorder)
    state.finished(A, 10)
    assert len(recorder.events) == 4


def test_a_failing_listener_does_not_stop_updates(state: FleetState) -> None:
    def broken(replica: str, change: FleetChange) -> None:
        raise RuntimeError("boom")

    recorder = Recorder()
    state.add_listener(broken)
    state.add_listener(recorder)
    state.record_scrape(B, METRICS)
    assert recorder.events == [(B, FleetChange.METRICS)]
    assert state.snapshot().replicas[1].scraped_at is not None


def test_version_grows_on_every_change(state: FleetState) -> None:
    seen = [state.version]
    state.dispatched(A, 1)
    seen.append(state.version)
    state.record_scrape(A, METRICS)
    seen.append(state.version)
    state.report_failure(A, "timeout")
    seen.append(state.version)
    assert seen == sorted(set(seen))


def test_kv_capacity(state: FleetState) -> None:
    assert state.kv_capacity_tokens(A) is None
    state.record_scrape(A, parse_metrics((FIXTURES / "metrics.txt").read_text()))
    assert state.kv_capacity_tokens(A) == 128 * 16384


def test_models_and_pool_resolution(state: FleetState) -> None:
    assert state.models().base_models == ("tiny-llama", "other")
    assert dict(state.models().adapters) == {}
    assert state.pool_of("tiny-llama") == ("tiny-llama", None)
    assert state.pool_of("lora-a") is None

    state.record_models(A, parse_models((FIXTURES / "models_with_adapters.json").read_bytes()))
    assert state.pool_of("lora-a") == ("tiny-llama", "lora-a")
    assert state.pool_of("lora-b") == ("tiny-llama", "lora-b")
    assert state.pool_of("nope") is None
    # an adapter seen only in lora_requests_info counts too; the same adapter in two pools goes to
    # the first pool in config order
    state.record_scrape(C, ReplicaMetrics(running=0, waiting=0, kv_usage=0.0,
                                          running_adapters=("lora-c", "lora-a")))
    assert state.pool_of("lora-c") == ("other", "lora-c")
    assert state.pool_of("lora-a") == ("tiny-llama", "lora-a")
    a = state.snapshot().by_name(A)
    assert a is not None and a.adapters == {"lora-a", "lora-b"}

    models_before = state.models()
    state.record_models(A, parse_models((FIXTURES / "models_with_adapters.json").read_bytes()))
    assert state.models() is models_before  # unchanged list: nothing rebuilt
    state.record_models(A, ServedModels(("tiny-llama",)))  # adapters unloaded
    assert state.pool_of("lora-b") is None


def test_unknown_replica_writers_do_nothing_readers_say_none_drain_is_a_key_error(
    state: FleetState,
) -> None:
    """A scrape or a request that outlived its replica (it left the fleet meanwhile) changes nothing."""
    version = state.version
    state.dispatched("nope", 1)
    state.finished("nope", 1)
    state.report_failure("nope", "connect")
    state.record_scrape("nope", METRICS)
    state.record_health("nope", True)
    state.record_models("nope", ServedModels(("tiny-llama",)))
    assert state.version == version and state.names() == (A, B, C)
    assert state.kv_capacity_tokens("nope") is None and state.scrape_age_s("nope") is None
    assert not state.routable("nope")
    with pytest.raises(KeyError):
        state.drain("nope")
