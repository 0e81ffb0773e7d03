from __future__ import annotations

import dataclasses

import pytest

from policies.saturation import (
    SaturationReason,
    SaturationThresholds,
    replica_headroom,
    saturation_reason,
)
from policies.types import ReplicaState

THR = SaturationThresholds(
    max_waiting_per_replica=4, max_kv_usage=0.9, max_in_flight_per_replica=10, stale_after_s=1.0
)
NOW = 100.0
OK = ReplicaState(name="r", url="http://r", pool="llama", scraped_at=NOW - 0.5, waiting=0, kv_usage=0.5,
                  in_flight=3)


def with_(**changes: object) -> ReplicaState:
    return dataclasses.replace(OK, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("replica", "reason"),
    [
        (OK, None),
        (with_(healthy=False), SaturationReason.UNHEALTHY),
        (with_(scraped_at=None), SaturationReason.STALE),  # never scraped
        (with_(scraped_at=NOW - 1.0), None),  # exactly at the staleness limit: still fresh
        (with_(scraped_at=NOW - 1.01), SaturationReason.STALE),
        (with_(waiting=4), None),  # the tolerated queue
        (with_(waiting=5), SaturationReason.WAITING),
        (with_(kv_usage=0.89), None),
        (with_(kv_usage=0.9), SaturationReason.KV_USAGE),
        (with_(in_flight=9), None),
        (with_(in_flight=10), SaturationReason.IN_FLIGHT),
        (with_(healthy=False, scraped_at=None, waiting=99), SaturationReason.UNHEALTHY),  # first rule
    ],
)
def test_replica_rules(replica: ReplicaState, reason: SaturationReason | None) -> None:
    assert saturation_reason(replica, THR, NOW) is reason


def test_zero_tolerated_waiting_means_any_queue_saturates() -> None:
    thr = dataclasses.replace(THR, max_waiting_per_replica=0)
    assert saturation_reason(OK, thr, NOW) is None
    assert saturation_reason(with_(waiting=1), thr, NOW) is SaturationReason.WAITING


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_waiting_per_replica": -1},
        {"max_kv_usage": 0.0},
        {"max_kv_usage": 1.5},
        {"max_in_flight_per_replica": 0},
        {"stale_after_s": 0.0},
    ],
)
def test_thresholds_refuse_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(THR, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("replica", "room"),
    [
        (OK, 5),  # waiting allows 4 more + the one that tips it over; in-flight allows 7
        (with_(waiting=4), 1),
        (with_(in_flight=8), 2),
        (with_(in_flight=9, waiting=0), 1),
        (with_(in_flight=10), 0),
        (with_(kv_usage=0.95), 0),  # KV only gates
        (with_(scraped_at=None), 0),
    ],
)
def test_replica_headroom(replica: ReplicaState, room: int) -> None:
    assert replica_headroom(replica, THR, NOW) == room
