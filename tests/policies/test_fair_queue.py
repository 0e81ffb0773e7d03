from __future__ import annotations

import copy
import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.fair_queue import FairQueue, QueuedWork, QueueItem
from policies.types import Band

S, C, X = Band.STANDARD, Band.CRITICAL, Band.SHEDDABLE


def mk(
    item_id: str,
    tenant: str = "a",
    band: Band = S,
    *,
    cost: int = 100,
    weight: float = 1.0,
    deadline: float = math.inf,
    at: float = 0.0,
) -> QueueItem[None]:
    return QueueItem(item_id, tenant, band, weight, cost, at, deadline, None)


def pop(q: FairQueue[None]) -> QueueItem[None]:
    it = q.pop()
    assert it is not None
    return it


def drain(q: FairQueue[None]) -> list[str]:
    out = []
    while (it := q.pop()) is not None:
        out.append(it.item_id)
    return out


def test_empty_queue() -> None:
    q: FairQueue[None] = FairQueue()
    assert len(q) == 0
    assert q.pop() is None
    assert q.peek() is None
    assert q.expire(1e9) == []
    assert q.remove("nope") is None
    assert q.depth_by_band() == {C: 0, S: 0, X: 0}


def test_strict_priority_between_bands() -> None:
    q: FairQueue[None] = FairQueue()
    for it in [mk("x1", "a", X), mk("s1", "a", S), mk("c1", "b", C), mk("s2", "b", S), mk("c2", "a", C)]:
        q.push(it)
    head = q.peek()
    assert head is not None and head.item_id == "c1"
    assert drain(q) == ["c1", "c2", "s1", "s2", "x1"]


def test_a_critical_arrival_overtakes_a_long_standard_backlog() -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(5):
        q.push(mk(f"s{i}", "a", S, cost=10_000))
    assert q.pop() is not None
    q.push(mk("c", "b", C, cost=10_000))
    assert pop(q).item_id == "c"


def test_fifo_within_a_tenant_whatever_the_costs() -> None:
    q: FairQueue[None] = FairQueue()
    costs = [5000, 1, 300, 1, 7000, 20]
    for i, cost in enumerate(costs):
        q.push(mk(f"a{i}", "a", cost=cost))
    assert drain(q) == [f"a{i}" for i in range(len(costs))]


def served_tokens(q: FairQueue[None], pops: int) -> Counter[str]:
    got: Counter[str] = Counter()
    for _ in range(pops):
        it = q.pop()
        assert it is not None
        got[it.tenant] += it.cost_tokens
    return got


@pytest.mark.parametrize(
    ("weight_a", "cost_a", "weight_b", "cost_b"),
    [
        (1, 100, 1, 100),
        (2, 100, 1, 100),  # twice the weight: twice the tokens
        (1, 100, 2, 100),
        (3, 50, 1, 400),
        (1, 4000, 1, 100),  # by tokens, not by requests: A gets 1/40 of B's request count
        (2, 4000, 1, 100),
        (1, 1, 1, 100),
    ],
)
def test_backlogged_tenants_share_tokens_by_weight(
    weight_a: float, cost_a: int, weight_b: float, cost_b: int
) -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(2000):
        q.push(mk(f"a{i}", "a", cost=cost_a, weight=weight_a))
        q.push(mk(f"b{i}", "b", cost=cost_b, weight=weight_b))
    got = served_tokens(q, 1000)
    assert q.depth_of("a") > 0 and q.depth_of("b") > 0  # both stayed backlogged
    # Start-time fair queuing's bound: normalized service differs by at most one item of each.
    assert abs(got["a"] / weight_a - got["b"] / weight_b) <= cost_a / weight_a + cost_b / weight_b


def test_weight_two_gets_twice_the_token_share_over_a_long_backlog() -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(1000):
        q.push(mk(f"a{i}", "a", cost=250, weight=2))
        q.push(mk(f"b{i}", "b", cost=250, weight=1))
    got = served_tokens(q, 900)
    assert got["a"] == 2 * got["b"]


def test_free_items_are_charged_one_token_and_cannot_hold_the_band() -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(1000):
        q.push(mk(f"free{i}", "free", cost=0))
    q.push(mk("paid", "paid", cost=10))
    assert drain(q).index("paid") == 1  # the free tenant's second item starts at virtual time 1


def test_huge_requests_do_not_starve_small_ones() -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(10):
        q.push(mk(f"huge{i}", "big", cost=10_000))
    for i in range(300):
        q.push(mk(f"small{i}", "small", cost=100))
    first = [pop(q).tenant for _ in range(102)]
    # One huge item went first (it arrived first); then 100 small ones fill its virtual time.
    assert first[0] == "big"
    assert first[1:101] == ["small"] * 100


def test_idle_tenant_comes_back_without_banked_credit() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("b0", "b"))
    assert pop(q).item_id == "b0"
    for i in range(1000):  # b is idle while a is served for a long time
        q.push(mk(f"a{i}", "a"))
        assert pop(q).item_id == f"a{i}"
    for i in range(1000, 1100):
        q.push(mk(f"a{i}", "a"))
    for i in range(1, 101):
        q.push(mk(f"b{i}", "b"))
    got = served_tokens(q, 40)
    assert got == Counter(a=2000, b=2000)  # alternating, not a run of b's


def test_a_tenant_still_pays_for_a_large_item_served_just_before_it_went_empty() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("a-big", "a", cost=1000))
    assert pop(q).item_id == "a-big"
    q.push(mk("a-next", "a", cost=100))
    for i in range(20):
        q.push(mk(f"b{i}", "b", cost=100))
    order = drain(q)
    assert order.index("a-next") == 10  # after b's 10 items fill a's 1000 tokens


def test_remove_leaves_the_queue_without_a_fairness_charge() -> None:
    def scenario(with_removed: bool) -> list[str]:
        q: FairQueue[None] = FairQueue()
        if with_removed:
            q.push(mk("a-gone", "a", cost=50_000))
        q.push(mk("a1", "a"))
        q.push(mk("b1", "b"))
        q.push(mk("a2", "a"))
        q.push(mk("b2", "b"))
        if with_removed:
            removed = q.remove("a-gone")
            assert removed is not None and removed.item_id == "a-gone"
        return drain(q)

    assert scenario(with_removed=True) == scenario(with_removed=False) == ["a1", "b1", "a2", "b2"]


def test_remove_updates_counts_and_is_idempotent() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("a1", "a", cost=10))
    q.push(mk("a2", "a", C, cost=20))
    q.push(mk("b1", "b", cost=30))
    assert "a2" in q and q.get("a2") is not None
    assert q.remove("a2") is not None
    assert q.remove("a2") is None
    assert "a2" not in q and q.get("a2") is None
    assert len(q) == 2
    assert q.depth_of("a") == 1 and q.depth_of("b") == 1 and q.depth_of("zz") == 0
    assert q.depth_by_band() == {C: 0, S: 2, X: 0}
    assert q.work_ahead(S) == QueuedWork(requests=2, tokens=40)
    assert drain(q) == ["a1", "b1"]
    assert q.depth_of("a") == 0


def test_work_ahead_counts_the_band_and_those_above() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("c", "a", C, cost=1))
    q.push(mk("s", "a", S, cost=10))
    q.push(mk("x", "a", X, cost=100))
    assert q.work_ahead(C) == QueuedWork(1, 1)
    assert q.work_ahead(S) == QueuedWork(2, 11)
    assert q.work_ahead(X) == QueuedWork(3, 111)


def test_push_refuses_a_duplicate_id_but_an_id_may_return_after_it_left() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("r", "a"))
    with pytest.raises(ValueError, match="already queued"):
        q.push(mk("r", "b"))
    assert q.pop() is not None
    q.push(mk("r", "b"))
    assert pop(q).tenant == "b"


@pytest.mark.parametrize(("weight", "cost"), [(0, 1), (-1, 1), (math.inf, 1), (math.nan, 1), (1, -1)])
def test_item_refuses_bad_weight_or_cost(weight: float, cost: int) -> None:
    with pytest.raises(ValueError):
        QueueItem("i", "t", S, weight, cost, 0.0, math.inf, None)


@pytest.mark.parametrize(
    ("now", "expired"),
    [
        (0.5, []),
        (1.0, ["d1"]),  # deadline == now: it cannot start in time any more
        (2.5, ["d1", "d2a", "d2b"]),  # by deadline, ties in push order
        (100.0, ["d1", "d2a", "d2b", "d3"]),
    ],
)
def test_expire_returns_exactly_the_overdue_items_in_deadline_order(now: float, expired: list[str]) -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("d3", "a", deadline=3.0))
    q.push(mk("d2a", "b", C, deadline=2.0))
    q.push(mk("never", "a"))
    q.push(mk("d1", "c", X, deadline=1.0))
    q.push(mk("d2b", "a", deadline=2.0))
    assert [it.item_id for it in q.expire(now)] == expired
    assert len(q) == 5 - len(expired)
    assert q.expire(now) == []
    remaining = drain(q)
    assert set(remaining) == {"d3", "d2a", "never", "d1", "d2b"} - set(expired)


def test_expire_ignores_items_that_already_left_even_if_their_id_came_back() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("r", "a", deadline=1.0))
    q.push(mk("gone", "a", deadline=1.0))
    assert pop(q).item_id == "r"
    assert q.remove("gone") is not None
    q.push(mk("r", "a", deadline=5.0))  # same id, later deadline
    assert q.expire(2.0) == []
    assert [it.item_id for it in q.expire(5.0)] == ["r"]


def test_expired_items_charge_nothing() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("a-late", "a", cost=50_000, deadline=1.0))
    q.push(mk("a1", "a", deadline=10.0))
    q.push(mk("b1", "b"))
    q.push(mk("b2", "b"))
    assert [it.item_id for it in q.expire(1.0)] == ["a-late"]
    assert drain(q) == ["a1", "b1", "b2"]


def test_many_departures_keep_the_internal_heaps_bounded() -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(1000):
        q.push(mk(f"i{i}", f"t{i}", deadline=1000.0 + i))
    for i in range(990):
        assert q.remove(f"i{i}") is not None
    # Stale heap entries are compacted away once they outnumber the live ones (memory stays O(n)).
    assert len(q._bands[S].heap) < 200
    assert len(q._deadlines) < 200
    assert drain(q) == [f"i{i}" for i in range(990, 1000)]
    assert q.expire(1e9) == []


# --- invariants -------------------------------------------------------------------------------

Op = tuple[str, int, int, int, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "push", "pop", "remove", "expire"]),
        st.integers(0, 3),  # tenant
        st.integers(0, 2),  # band
        st.integers(0, 500),  # cost
        st.integers(0, 40),  # deadline or target
    ),
    max_size=120,
)


@given(ops)
def test_every_item_leaves_exactly_once_and_orders_hold(steps: list[Op]) -> None:
    q: FairQueue[None] = FairQueue()
    pushed: dict[str, QueueItem[None]] = {}
    left: list[str] = []
    popped_per_flow: dict[tuple[str, Band], list[int]] = {}
    now = 0.0
    n = 0
    for op, tenant, band, cost, k in steps:
        if op == "push":
            n += 1
            it = mk(f"i{n}", f"t{tenant}", Band(band), cost=cost, weight=1 + tenant,
                    deadline=now + k if k < 30 else math.inf)
            q.push(it)
            pushed[it.item_id] = it
        elif op == "pop":
            before = q.depth_by_band()
            got = q.pop()
            if got is None:
                assert len(q) == 0
                continue
            assert all(before[b] == 0 for b in Band if b < got.band)  # strict priority
            left.append(got.item_id)
            popped_per_flow.setdefault((got.tenant, got.band), []).append(int(got.item_id[1:]))
        elif op == "remove":
            target = f"i{k}"
            removed = q.remove(target)
            assert (removed is not None) == (target in pushed and target not in left)
            if removed is not None:
                left.append(target)
        else:
            now += k / 10
            gone = q.expire(now)
            assert all(it.deadline <= now for it in gone)
            assert [(it.deadline) for it in gone] == sorted(it.deadline for it in gone)
            left.extend(it.item_id for it in gone)
        waiting = [i for i in pushed if i not in left]
        assert len(q) == len(waiting)
        assert all(i in q for i in waiting)
        if op == "expire":
            assert all(pushed[i].deadline > now for i in waiting)  # nothing overdue survives it
        for tenant_i in range(4):
            assert q.depth_of(f"t{tenant_i}") == sum(1 for i in waiting if pushed[i].tenant == f"t{tenant_i}")
    assert len(left) == len(set(left))  # nobody leaves twice
    rest = drain(q)
    assert sorted(left + rest) == sorted(pushed)
    for ids in popped_per_flow.values():
        assert ids == sorted(ids)  # FIFO inside a tenant and band


def replay(steps: list[Op], skip: set[str]) -> tuple[list[str], set[str]]:
    """Run push/pop/remove steps, leaving out the pushes in `skip`; at the end expire the first half
    of the deadlines (checking exactly those go), then drain. Returns every departure in order and
    the ids that `remove` took out."""
    q: FairQueue[None] = FairQueue()
    out: list[str] = []
    removed: set[str] = set()
    n = 0
    for op, tenant, band, cost, k in steps:
        if op == "push":
            n += 1
            if f"i{n}" not in skip:
                q.push(mk(f"i{n}", f"t{tenant}", Band(band), cost=cost, weight=1 + tenant % 3,
                          deadline=float(n)))
        elif op == "pop":
            it = q.pop()
            if it is not None:
                out.append(it.item_id)
        elif op == "remove" and f"i{k}" not in skip and q.remove(f"i{k}") is not None:
            removed.add(f"i{k}")
    overdue = [f"i{i}" for i in range(1, n // 2 + 1) if f"i{i}" in q]  # deadline order = push order
    expired = [it.item_id for it in q.expire(n // 2)]
    assert expired == overdue
    return out + expired + drain(q), removed


@given(ops)
def test_removed_items_leave_no_trace_in_the_order(steps: list[Op]) -> None:
    """A queue where some items were removed pops exactly like one where they were never pushed."""
    with_removals, removed = replay(steps, skip=set())
    never_pushed, _ = replay(steps, skip=removed)
    assert with_removals == never_pushed


@pytest.mark.parametrize("seed", range(5))
def test_removal_equivalence_holds_through_heap_compaction(seed: int) -> None:
    """Long random runs with many departures (so stale heap entries get compacted) still pop exactly
    like a queue that never saw the removed items."""
    rng = random.Random(seed)
    steps: list[Op] = []
    for n in range(1, 3001):
        steps.append(("push", rng.randrange(40), rng.randrange(3), rng.randrange(1, 2000), 0))
        if rng.random() < 0.6:
            steps.append(("remove", 0, 0, 0, rng.randrange(1, n + 1)))
        if rng.random() < 0.2:
            steps.append(("pop", 0, 0, 0, 0))
    with_removals, removed = replay(steps, skip=set())
    never_pushed, _ = replay(steps, skip=removed)
    assert len(removed) > 500
    assert with_removals == never_pushed


# --- pop(eligible): the next item among some tenants only ---------------------------------------


def test_pop_eligible_skips_the_other_tenants_who_keep_their_places() -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(4):
        q.push(mk(f"a{i}", "a"))
    q.push(mk("b0", "b"))
    q.push(mk("c0", "c", cost=10))
    assert pop(q).item_id == "a0"
    got = q.pop(eligible=lambda t: t != "a")
    assert got is not None and got.item_id == "b0"  # b's tag is older than c's push order
    assert q.pop(eligible=lambda t: t == "z") is None  # nobody eligible: nothing leaves
    assert len(q) == 4
    assert drain(q) == ["c0", "a1", "a2", "a3"]


def test_pop_eligible_keeps_strict_priority_among_the_eligible() -> None:
    q: FairQueue[None] = FairQueue()
    q.push(mk("a-crit", "a", C))
    q.push(mk("b-std", "b", S))
    q.push(mk("b-crit", "b", C))
    got = q.pop(eligible=lambda t: t == "b")
    assert got is not None and got.item_id == "b-crit"
    assert drain(q) == ["a-crit", "b-std"]


def expected_eligible_pop(q: FairQueue[None], eligible: set[str]) -> str | None:
    """The oracle: the plain `pop` of a copy without the other tenants' items (removal charges
    nothing and changes no other tag, so that copy orders the eligible items exactly as `q` does)."""
    twin = copy.deepcopy(q)
    for item_id in [e for e in twin._entries if twin._entries[e].item.tenant not in eligible]:
        twin.remove(item_id)
    got = twin.pop()
    return None if got is None else got.item_id


@given(ops)
def test_pop_eligible_matches_the_queue_without_the_others(steps: list[Op]) -> None:
    q: FairQueue[None] = FairQueue()
    pushed: set[str] = set()
    left: list[str] = []
    n = 0
    for op, tenant, band, cost, k in steps:
        if op == "push":
            n += 1
            q.push(mk(f"i{n}", f"t{tenant}", Band(band), cost=cost, weight=1 + tenant % 3))
            pushed.add(f"i{n}")
        elif op == "pop":
            got = q.pop()
            if got is not None:
                left.append(got.item_id)
        else:  # remove and expire stand in for eligible pops here: tenants k % 4 .. k % 4 + 1
            eligible = {f"t{k % 4}", f"t{(k + 1) % 4}"}
            want = expected_eligible_pop(q, eligible)
            got = q.pop(eligible=eligible.__contains__)
            assert (got.item_id if got is not None else None) == want
            if got is not None:
                left.append(got.item_id)
        assert len(q) == len(pushed) - len(left)
    left += drain(q)
    assert sorted(left) == sorted(pushed) and len(left) == len(set(left))


def test_eligible_pops_keep_the_heap_bounded() -> None:
    q: FairQueue[None] = FairQueue()
    for i in range(2000):
        q.push(mk(f"i{i}", f"t{i % 50}"))
        if i % 2:
            assert q.pop(eligible=lambda t: t != "t0") is not None
    assert len(q._bands[S].heap) <= 2 * 50 + 64 + 1  # stale entries compacted
    assert len(drain(q)) == 1000
