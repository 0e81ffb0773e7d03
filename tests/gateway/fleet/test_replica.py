"""gateway/fleet/replica.py: the health circuit breaker and in-flight counts, as tables of events."""

from __future__ import annotations

import pytest

from gateway.config import FleetConfig, ReplicaConfig
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.models_parse import ServedModels
from gateway.fleet.replica import ReplicaRecord

FLEET = FleetConfig(eject_after_failures=2, eject_backoff_s=1.0, eject_backoff_max_s=4.0)
CONFIG = ReplicaConfig(url="http://10.0.0.1:8000", model="m")

# (time, event, healthy after, ejected_until after)
Step = tuple[float, str, bool, float | None]


def run(steps: list[Step]) -> None:
    record = ReplicaRecord(CONFIG, FLEET, now=0.0)
    for t, event, healthy, until in steps:
        if event == "scrape_ok":
            record.record_success(t, from_health_check=False)
        elif event == "health_ok":
            record.record_success(t, from_health_check=True)
        else:
            record.record_failure(t, event)
        assert (not record.ejected, record.ejected_until) == (healthy, until), (t, event)
        assert record.to_state().healthy == healthy


CASES: dict[str, list[Step]] = {
    "soft failures eject at the threshold": [
        (0.0, "timeout", True, None),
        (0.2, "status_5xx", False, 1.2),
    ],
    "a success in between resets the count": [
        (0.0, "timeout", True, None),
        (0.2, "scrape_ok", True, None),
        (0.4, "timeout", True, None),
    ],
    "connection refused ejects at once": [
        (0.0, "connect", False, 1.0),
    ],
    "health saying unhealthy ejects at once": [
        (0.0, "unhealthy", False, 1.0),
    ],
    "no re-entry before the backoff, re-entry on the first success after": [
        (0.0, "connect", False, 1.0),
        (0.5, "scrape_ok", False, 1.0),
        (0.9, "health_ok", False, 1.0),
        (1.0, "scrape_ok", True, None),
    ],
    "no re-entry without a success": [
        (0.0, "connect", False, 1.0),
        (0.5, "timeout", False, 1.0),  # failures during the backoff change nothing
    ],
    "failed probes double the backoff up to the cap": [
        (0.0, "connect", False, 1.0),
        (1.0, "connect", False, 3.0),
        (3.0, "timeout", False, 7.0),
        (7.0, "connect", False, 11.0),  # 8 s capped at 4 s
        (11.0, "connect", False, 15.0),
        (15.0, "scrape_ok", True, None),
    ],
    "re-ejection soon after re-entry backs off longer": [
        (0.0, "connect", False, 1.0),
        (1.0, "scrape_ok", True, None),
        (2.0, "connect", False, 4.0),
    ],
    "staying in rotation for the max backoff forgives past ejections": [
        (0.0, "connect", False, 1.0),
        (1.0, "scrape_ok", True, None),
        (5.0, "scrape_ok", True, None),  # 4 s in rotation
        (6.0, "connect", False, 7.0),  # back to the base backoff
    ],
    "after unhealthy only a good health check readmits": [
        (0.0, "unhealthy", False, 1.0),
        (1.5, "scrape_ok", False, 1.0),  # /metrics still answers; the engine said it is dead
        (2.0, "health_ok", True, None),
    ],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=CASES.keys())
def test_health(steps: list[Step]) -> None:
    run(steps)


def test_in_flight_never_negative() -> None:
    record = ReplicaRecord(CONFIG, FLEET, now=0.0)
    record.dispatched(100)
    record.dispatched(50)
    record.finished(100)
    assert (record.in_flight, record.in_flight_tokens) == (1, 50)
    record.finished(50)
    record.finished(50)  # unpaired
    assert (record.in_flight, record.in_flight_tokens) == (0, 0)
    record.dispatched(-5)  # a bad count cannot make load negative either
    assert (record.in_flight, record.in_flight_tokens) == (1, 0)


def test_state_from_scrape_and_models() -> None:
    record = ReplicaRecord(
        ReplicaConfig(url="http://h:1", model="m", name="r1", labels={"zone": "a"}), FLEET, now=0.0
    )
    state = record.to_state()
    assert (state.name, state.url, state.pool, state.scraped_at) == ("r1", "http://h:1", "m", None)
    assert state.kv_capacity_tokens == 0
    assert dict(state.labels) == {"zone": "a"}

    metrics = ReplicaMetrics(running=2, waiting=3, kv_usage=0.5, block_size=128, num_gpu_blocks=10,
                             max_loras=2, running_adapters=("a",), waiting_adapters=("b",))
    assert record.record_metrics(metrics, now=5.0) == (True, True)  # adapters and capacity new
    assert record.record_metrics(metrics, now=6.0) == (False, False)
    assert record.record_served(ServedModels(("m",), {"a": "m", "c": "m"})) is True
    assert record.record_served(ServedModels(("m",), {"a": "m", "c": "m"})) is False
    state = record.to_state()
    assert (state.scraped_at, state.running, state.waiting, state.kv_usage) == (6.0, 2, 3, 0.5)
    assert (state.block_size, state.num_gpu_blocks, state.max_loras) == (128, 10, 2)
    assert state.adapters == {"a", "b", "c"}
    assert state.active_adapters == {"a"}
    assert record.kv_capacity_tokens == 1280
