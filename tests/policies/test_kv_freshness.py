"""KV events go stale only when the replica was sent work and stayed silent: idle engines publish
nothing."""

from __future__ import annotations

import pytest

from policies.kv_freshness import EventFreshness


def test_silence_without_traffic_is_not_staleness() -> None:
    f = EventFreshness(10.0)
    f.heard(0.0)
    assert not f.stale(1_000_000.0)


def test_silence_after_a_dispatch_is_staleness_once_it_lasts() -> None:
    f = EventFreshness(10.0)
    f.heard(0.0)
    f.dispatched(100.0)
    f.dispatched(105.0)  # the first dispatch since the last batch is what counts
    assert not f.stale(110.0)
    assert f.stale(110.5)
    f.heard(111.0)
    assert not f.stale(500.0)


def test_a_replica_never_heard_from_goes_stale_when_it_is_sent_work() -> None:
    f = EventFreshness(1.0)
    assert not f.stale(5.0)
    f.dispatched(5.0)
    assert f.stale(6.5)


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventFreshness(0)
