"""policies/fair_share: who may take a pool's reserved slots (injected clock, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.fair_share import FairShare


def none_queued(_: str) -> int:
    return 0


def test_a_tenant_alone_may_fill_the_pool() -> None:
    fs = FairShare(window_s=10.0)
    for _ in range(31):
        fs.started("a", 1.0, now=0.0)
    assert fs.below_share("a", room=1, now=0.0, queued=none_queued)  # 31 < 32 * 1/1
    fs.started("a", 1.0, now=0.0)
    assert not fs.below_share("a", room=0, now=0.0, queued=none_queued)


def test_alone_while_at_most_one_tenant_is_active() -> None:
    fs = FairShare(window_s=10.0)
    assert fs.alone(now=0.0, queued=none_queued)  # nobody
    fs.started("a", 1.0, now=0.0)
    assert fs.alone(now=0.0, queued=none_queued)
    fs.started("b", 1.0, now=1.0)
    fs.ended("b", now=2.0)
    assert not fs.alone(now=11.9, queued=none_queued)  # b holds nothing but was seen within the window
    assert fs.alone(now=12.1, queued=none_queued)  # b's window has passed
    fs.seen("c", 1.0, now=0.0)
    assert not fs.alone(now=30.0, queued=lambda t: 1 if t == "c" else 0)  # c waits in the queue


def test_the_heavy_tenant_is_held_back_while_a_light_one_is_active() -> None:
    fs = FairShare(window_s=10.0)
    for _ in range(30):
        fs.started("heavy", 1.0, now=0.0)
    fs.started("light", 1.0, now=1.0)
    fs.ended("light", now=2.0)  # nothing in flight now, but active within the window
    assert fs.in_flight == 30 and fs.in_flight_of("light") == 0
    assert not fs.below_share("heavy", room=2, now=5.0, queued=none_queued)  # 30 >= 32 / 2
    assert fs.below_share("light", room=2, now=5.0, queued=none_queued)
    # The light tenant went quiet: after the window the heavy one has the pool again.
    assert fs.below_share("heavy", room=2, now=12.5, queued=none_queued)


def test_a_queued_tenant_counts_as_active_past_the_window() -> None:
    fs = FairShare(window_s=1.0)
    for _ in range(8):
        fs.started("heavy", 1.0, now=0.0)
    fs.seen("light", 1.0, now=0.0)
    queued = {"light": 1}.get
    assert not fs.below_share("heavy", room=1, now=60.0, queued=lambda t: queued(t, 0))
    assert fs.below_share("heavy", room=1, now=60.0, queued=none_queued)


def test_weights_set_the_shares() -> None:
    fs = FairShare(window_s=10.0)
    for _ in range(20):
        fs.started("big", 3.0, now=0.0)
    for _ in range(9):
        fs.started("small", 1.0, now=0.0)
    # capacity 32: big's share 24, small's 8.
    assert fs.below_share("big", room=3, now=0.0, queued=none_queued)
    assert not fs.below_share("small", room=3, now=0.0, queued=none_queued)


def test_never_seen_tenants_are_below_share_and_ends_never_go_negative() -> None:
    fs = FairShare(window_s=10.0)
    assert fs.below_share("new", room=0, now=0.0, queued=none_queued)
    fs.ended("new", now=0.0)
    fs.started("a", 1.0, now=0.0)
    fs.ended("a", now=0.0)
    fs.ended("a", now=0.0)
    assert fs.in_flight == 0 and fs.in_flight_of("a") == 0


def test_idle_tenants_are_forgotten() -> None:
    fs = FairShare(window_s=1.0)
    for i in range(100):
        fs.started(f"t{i}", 1.0, now=0.0)
        fs.ended(f"t{i}", now=0.0)
    fs.started("x", 1.0, now=5.0)
    fs.below_share("x", room=1, now=5.0, queued=none_queued)
    assert set(fs._tenants) == {"x"}


@pytest.mark.parametrize("window", [-1.0, float("inf"), float("nan")])
def test_window_must_be_finite_and_non_negative(window: float) -> None:
    with pytest.raises(ValueError):
        FairShare(window_s=window)


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=200), st.integers(0, 8))
def test_in_flight_counts_follow_starts_and_ends(ops: list[tuple[int, bool]], room: int) -> None:
    fs = FairShare(window_s=5.0)
    held = [0, 0, 0, 0]
    for t, start in ops:
        if start:
            fs.started(f"t{t}", 1.0 + t, now=0.0)
            held[t] += 1
        else:
            fs.ended(f"t{t}", now=0.0)
            held[t] = max(0, held[t] - 1)
    assert fs.in_flight == sum(held)
    assert [fs.in_flight_of(f"t{t}") for t in range(4)] == held
    # Someone active is always below share when there is room: the shares add up to the capacity.
    active = [t for t in range(4) if held[t] or any(o[0] == t for o in ops)]
    if active and room > 0:
        assert any(fs.below_share(f"t{t}", room, 0.0, none_queued) for t in active)


@given(
    st.lists(st.tuples(st.integers(0, 5), st.booleans(), st.integers(0, 30)), max_size=120),
    st.integers(1, 6),  # callers ask only while the pool has room
    st.integers(30, 40),
)
def test_eligibility_matches_the_rule_worked_out_from_scratch(
    ops: list[tuple[int, bool, int]], room: int, now: int
) -> None:
    """The rule of the module docstring, recomputed here from the raw events, for every tenant."""
    window = 5.0
    fs = FairShare(window_s=window)
    held: dict[str, int] = {}
    last: dict[str, float] = {}
    weight = {f"t{t}": 1.0 + t % 3 for t in range(7)}
    for t, start, at in ops:
        name = f"t{t}"
        if start:
            fs.started(name, weight[name], now=float(at))
            held[name] = held.get(name, 0) + 1
            last[name] = max(last.get(name, float(at)), float(at))
        else:
            fs.ended(name, now=float(at))
            if held.get(name, 0) > 0:
                held[name] -= 1
                last[name] = max(last[name], float(at))

    def queued(name: str) -> int:
        return 1 if name == "t5" else 0

    seen = set(last)
    below = fs.eligibility(room, float(now), queued)
    for t in range(7):
        name = f"t{t}"
        if name not in seen:
            assert below(name)
            continue
        active = {
            n for n in seen if held.get(n, 0) > 0 or last[n] >= now - window or queued(n) > 0 or n == name
        }
        capacity = sum(held.values()) + room
        expected = held.get(name, 0) < capacity * weight[name] / sum(weight[n] for n in active)
        assert below(name) == expected, (name, held, last)
