"""FleetState.apply, drain and phases with an injected clock: joins, changes, departures, listeners."""

from __future__ import annotations

from gateway.config import FleetConfig, ReplicaConfig
from gateway.fleet.membership import ReplicaSpec
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.models_parse import ServedModels
from gateway.fleet.state import FleetChange, FleetState
from policies.types import ReplicaPhase

FLEET = FleetConfig()
STATIC = ReplicaConfig(url="http://10.0.0.1:8000", model="m", name="s")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def spec(name: str, url: str | None = None, model: str | None = "m", **kw: object) -> ReplicaSpec:
    return ReplicaSpec(name=name, url=url or f"http://{name}:8000", model=model, await_model=True,
                       source="kubernetes", **kw)  # type: ignore[arg-type]  # fmt: skip


def desired(*specs: ReplicaSpec) -> dict[str, ReplicaSpec]:
    static = ReplicaSpec.from_config(STATIC)
    return {static.name: static, **{s.name: s for s in specs}}


def events(state: FleetState) -> list[tuple[str, FleetChange]]:
    log: list[tuple[str, FleetChange]] = []
    state.add_listener(lambda name, change: log.append((name, change)))
    return log


def test_a_discovered_replica_is_not_ready_until_its_models_list_its_model() -> None:
    state = FleetState([STATIC], FLEET, Clock())
    log = events(state)
    version = state.membership_version
    applied = state.apply(desired(spec("p")))
    assert applied.joined == ("p",) and state.membership_version > version
    assert log == [("p", FleetChange.JOINED)]
    assert state.phase("p") is ReplicaPhase.NOT_READY and not state.routable("p")
    state.record_models("p", ServedModels(("other",)))
    assert state.phase("p") is ReplicaPhase.NOT_READY
    state.record_models("p", ServedModels(("m",)))
    assert state.phase("p") is ReplicaPhase.READY and state.routable("p")
    assert FleetChange.PHASE in log[-1][1]
    assert state.apply(desired(spec("p"))) == type(applied)()  # idempotent


def test_without_a_model_the_pool_is_learned_from_the_replica() -> None:
    state = FleetState([], FLEET, Clock())
    state.apply({"p": spec("p", model=None)})
    assert state.snapshot().by_name("p").pool == "" and state.pool_of("m") is None
    state.record_models("p", ServedModels(("m",)))
    assert state.snapshot().by_name("p").pool == "m" and state.pool_of("m") == ("m", None)
    assert state.routable("p")


def test_departure_waits_for_requests_in_flight_then_forgets() -> None:
    state = FleetState([STATIC], FLEET, Clock())
    state.apply(desired(spec("p")))
    state.record_models("p", ServedModels(("m",)))
    log = events(state)
    state.dispatched("p", 10)
    applied = state.apply(desired())
    assert applied.departed == ("p",)
    assert state.phase("p") is ReplicaPhase.TERMINATING and not state.routable("p")
    assert FleetChange.DEPARTED in log[-1][1]
    state.finished("p", 10)
    assert "p" not in state.names() and log[-1] == ("p", FleetChange.LEFT)
    assert state.snapshot().by_name("p") is None


def test_an_idle_departure_forgets_at_once_and_a_return_starts_over() -> None:
    state = FleetState([STATIC], FLEET, Clock())
    state.apply(desired(spec("p")))
    log = events(state)
    state.apply(desired())
    assert [c for _, c in log] == [FleetChange.DEPARTED, FleetChange.LEFT]
    state.apply(desired(spec("p")))
    assert state.phase("p") is ReplicaPhase.NOT_READY  # waits for its model again


def test_a_departing_replica_that_comes_back_is_revived_with_its_counts() -> None:
    state = FleetState([STATIC], FLEET, Clock())
    state.apply(desired(spec("p")))
    state.record_models("p", ServedModels(("m",)))
    state.dispatched("p", 10)
    state.apply(desired())
    state.apply(desired(spec("p")))
    assert state.phase("p") is ReplicaPhase.READY
    assert state.snapshot().by_name("p").in_flight == 1
    state.finished("p", 10)
    assert "p" in state.names()


def test_a_new_url_is_a_new_process() -> None:
    state = FleetState([STATIC], FLEET, Clock())
    state.apply(desired(spec("p")))
    state.record_models("p", ServedModels(("m",)))
    state.record_scrape("p", ReplicaMetrics(running=1, waiting=0, kv_usage=0.1))
    log = events(state)
    state.apply(desired(spec("p", url="http://10.9.9.9:8000")))
    assert FleetChange.RESET in log[-1][1]
    r = state.snapshot().by_name("p")
    assert r.url == "http://10.9.9.9:8000" and r.scraped_at is None and r.phase is ReplicaPhase.NOT_READY


def test_source_phases_and_drain() -> None:
    state = FleetState([STATIC], FLEET, Clock())
    state.apply(desired(spec("p", phase=ReplicaPhase.NOT_READY)))
    state.record_models("p", ServedModels(("m",)))
    assert state.phase("p") is ReplicaPhase.NOT_READY
    state.apply(desired(spec("p")))
    assert state.phase("p") is ReplicaPhase.READY
    state.apply(desired(spec("p", phase=ReplicaPhase.TERMINATING)))
    assert state.phase("p") is ReplicaPhase.TERMINATING
    state.apply(desired(spec("p")))
    assert state.drain("p") and not state.drain("p")
    assert state.phase("p") is ReplicaPhase.TERMINATING
    state.apply(desired(spec("p", labels={"zone": "b"})))  # the source's word does not undrain it
    assert state.phase("p") is ReplicaPhase.TERMINATING
    assert state.undrain("p") and state.phase("p") is ReplicaPhase.READY
    assert state.phase("s") is ReplicaPhase.READY  # static replicas do not wait for their model


def test_slow_start_ramps_a_replica_joining_a_pool_that_has_a_ready_one() -> None:
    clock = Clock()
    state = FleetState([STATIC], FLEET, clock)
    state.apply(desired(spec("p", slow_start_s=30.0)))
    clock.now = 105.0
    state.record_models("p", ServedModels(("m",)))
    r = state.snapshot().by_name("p")
    assert (r.ready_since, r.slow_start_s) == (105.0, 30.0)
    clock.now = 136.0
    state.record_scrape("p", ReplicaMetrics(running=0, waiting=0, kv_usage=0.0))
    assert state.snapshot().by_name("p").ready_since is None  # ramped up
    alone = FleetState([], FLEET, clock)
    alone.apply({"q": spec("q", slow_start_s=30.0)})
    alone.record_models("q", ServedModels(("m",)))
    assert alone.snapshot().by_name("q").ready_since is None  # nobody to share with
