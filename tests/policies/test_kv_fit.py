"""Placement that respects KV capacity: the group ledger (`policies.kv_fit`) with the `kv-fit` scorer.

A small model of the gateway's loop (decide, then record on the index and the ledger, as
`gateway.routing.Router` does), over two replicas of 32 index blocks each. A group's prompt is its
4 shared blocks and one block of its own, so the usable 80% (25.6 blocks) holds 6 groups, not 7.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from policies.kv_fit import GroupLedger, group_key
from policies.prefix_index import PrefixIndex
from policies.scheduling.builtin_profiles import build_builtin_profile
from policies.scheduling.context import SchedulingContext
from policies.scheduling.scorers.kv_fit import KvFitScorer
from policies.types import ReplicaState, RequestInfo

CAPACITY = 32.0  # index blocks per replica
SHARED = 4
NAMES = ("r0", "r1")
_unique = itertools.count(1 << 40)


def prompt(group: int) -> tuple[int, ...]:
    return (*(group * 100 + i for i in range(SHARED)), next(_unique))


class Loop:
    """Decide with the `kv-fit` profile, then record, as the Router does; loads are given per call."""

    def __init__(self, names: tuple[str, ...] = NAMES, capacity: float = CAPACITY, seed: int = 0) -> None:
        self.names = names
        self.capacity = capacity
        self.index = PrefixIndex(default_capacity=int(capacity))
        self.ledger = GroupLedger()
        self.profile = build_builtin_profile("kv-fit")
        self.rng = random.Random(seed)
        self.now = 0.0

    def send(self, keys: tuple[int, ...], loads: dict[str, int] | None = None) -> str:
        self.now += 0.05
        loads = loads or {}
        candidates = [
            ReplicaState(name=n, url=f"http://{n}", pool="m", scraped_at=self.now, in_flight=loads.get(n, 0),
                         num_gpu_blocks=int(self.capacity), block_size=64)
            for n in self.names
        ]
        match = self.index.match(keys, self.names)
        info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=320, max_tokens=8,
                           prefix_keys=keys)  # fmt: skip
        view = self.ledger.fit_view(keys, {n: self.capacity for n in self.names}, self.now)
        ctx = SchedulingContext(request=info, now=self.now, prefix_match=match, prefix_blocks=len(keys),
                                kv_fit=view)  # fmt: skip
        winner = self.profile.schedule(ctx, candidates, self.rng).ranked[0].name
        home = self.ledger.home_of(group_key(keys, self.ledger.group_blocks))
        held = self.index.match(keys, tuple({winner, home} - {None}))  # type: ignore[arg-type]
        on_home = held.get(home, 0) if home not in (None, winner) else 0
        self.ledger.record(keys, winner, held.get(winner, 0), self.now, on_home)
        self.index.record(winner, keys)
        return winner

    def groups_per_replica(self) -> list[int]:
        return sorted((self.ledger.groups_on(n) for n in self.names), reverse=True)


@pytest.mark.parametrize("seed", range(12))
def test_twelve_groups_over_two_replicas_end_within_capacity_whatever_the_order_and_load(seed: int) -> None:
    loop = Loop(seed=seed)
    rng = random.Random(seed)
    arrivals = [g for g in range(12) for _ in range(4)]
    rng.shuffle(arrivals)
    for g in arrivals:
        # Load noise that, without kv-fit, decides where a new group lands.
        loop.send(prompt(g), {n: rng.randrange(4) for n in NAMES})
    for _ in range(3):  # steady state: every group comes back
        for g in rng.sample(range(12), 12):
            loop.send(prompt(g), {n: rng.randrange(4) for n in NAMES})
    assert sum(loop.groups_per_replica()) == 12
    assert loop.groups_per_replica() == [6, 6]
    # ... and each group is served where it lives.
    for g in range(12):
        assert loop.send(prompt(g)) == loop.ledger.home_of(group_key(prompt(g), 2))


def test_new_groups_arriving_in_a_burst_on_a_loaded_replica_still_spread() -> None:
    # Every group's first request arrives while r1 looks busier: the queue alone would pile them on r0.
    loop = Loop()
    for g in range(12):
        loop.send(prompt(g), {"r0": 0, "r1": 3})
    for g in range(12):
        loop.send(prompt(g), {"r0": 0, "r1": 3})
    for _ in range(2):
        for g in range(12):
            loop.send(prompt(g))
    assert loop.groups_per_replica() == [6, 6]


def test_new_groups_that_fit_everywhere_spread_by_what_each_replica_holds() -> None:
    loop = Loop()
    for _ in range(3):
        for g in range(4):
            loop.send(prompt(g), {"r0": 0, "r1": 2})  # the queue alone would put them all on r0
    assert loop.groups_per_replica() == [2, 2]


def test_a_home_that_keeps_missing_loses_its_newest_group() -> None:
    loop = Loop()
    # r0 holds 5 groups and r1 3 (placed by a profile without kv-fit; the ledger only records).
    for g in range(8):
        home = "r0" if g < 5 else "r1"
        for _ in range(2):
            keys = prompt(g)
            held = loop.index.match(keys, (home,)).get(home, 0)
            loop.ledger.record(keys, home, held, loop.now)
            loop.index.record(home, keys)
    assert [loop.ledger.groups_on(n) for n in NAMES] == [5, 3]
    # Both fit by belief: group 4 stays home.
    assert loop.send(prompt(4)) == "r0"
    # The scrapes say r0 hits a third of what kvgate believed it would; r1 what was believed.
    hits = {"r0": 0, "r1": 0}
    queries = {"r0": 0, "r1": 0}
    for _ in range(4):
        for n, real in (("r0", 0.25), ("r1", 0.75)):
            loop.ledger._believe(n, 60, 80)  # believed: 75% of prompt blocks held
            queries[n] += 80 * 64
            hits[n] += int(real * 80 * 64)
            loop.ledger.observe_counters(n, hits[n], queries[n])
    assert loop.ledger.reality("r0") < 0.5 < loop.ledger.reality("r1")
    # r0's usable room shrank below its 5 groups: the newest must leave, and r1 has room for it.
    assert loop.send(prompt(4)) == "r1"
    assert loop.ledger.home_of(group_key(prompt(4), 2)) == "r1"
    assert loop.send(prompt(4)) == "r1"
    # The oldest groups keep their home.
    assert loop.send(prompt(0)) == "r0"


def test_a_group_that_must_move_but_fits_nowhere_stays() -> None:
    loop = Loop()
    for g in range(14):
        home = NAMES[g % 2]
        for _ in range(2):
            keys = prompt(g)
            held = loop.index.match(keys, (home,)).get(home, 0)
            loop.ledger.record(keys, home, held, loop.now)
            loop.index.record(home, keys)
    # 7 groups of 4 blocks each on both: neither fits a 7th; group 12 (r0's newest) stays.
    assert loop.send(prompt(12)) == "r0"
    assert loop.ledger.home_of(group_key(prompt(12), 2)) == "r0"


@pytest.mark.parametrize("full", [True, False])
def test_a_group_sent_off_its_home_is_re_homed_only_where_it_fits(full: bool) -> None:
    # Group 0 lives on r0; r1 is home to 6 groups (24 of its 25.6 usable blocks) or to 2. A request of
    # group 0 that the latency-knee filter sends to r1 while the index believes neither replica holds
    # it (r0 evicted it) re-places the group on r1 only if it fits there: otherwise its home stays r0
    # and the kv-fit scorer brings its next request back.
    ledger = GroupLedger()
    capacity = {n: CAPACITY for n in NAMES}
    for g in range(7 if full else 3):
        home = "r0" if g == 0 else "r1"
        ledger.fit_view(prompt(g), capacity, 0.0)
        ledger.record(prompt(g), home, 0, 0.0)
        ledger.record(prompt(g), home, SHARED, 0.1)  # reused: confirmed, 4 blocks
    ledger.fit_view(prompt(0), capacity, 0.2)
    ledger.record(prompt(0), "r1", 0, 0.2, held_on_home=0)
    assert ledger.home_of(group_key(prompt(0), 2)) == ("r0" if full else "r1")
    assert ledger.groups_on("r1") == (6 if full else 3)


def test_quiet_groups_stop_claiming_and_the_ledger_is_bounded() -> None:
    ledger = GroupLedger(quiet_s=10.0, provisional_s=1.0, max_groups=50)
    for g in range(200):
        ledger.record(prompt(g), "r0", 0, now=0.0)
    assert len(ledger) == 50
    ledger.record(prompt(7), "r1", 0, now=0.0)
    ledger.record(prompt(7), "r1", 0, now=0.5)  # reused: confirmed, its size the 4 blocks shared
    assert ledger.claimed("r1") == SHARED
    ledger.expire(5.0)
    assert ledger.groups_on("r0") == 0  # provisional singletons went quiet
    assert ledger.claimed("r1") == SHARED
    ledger.expire(11.0)
    assert len(ledger) == 0 and ledger.claimed("r1") == 0


def test_forgetting_a_replica_drops_its_groups() -> None:
    ledger = GroupLedger()
    ledger.record(prompt(1), "r0", 0, 0.0)
    ledger.record(prompt(2), "r1", 0, 0.0)
    ledger.forget_replica("r0")
    assert ledger.home_of(group_key(prompt(1), 2)) is None
    assert ledger.home_of(group_key(prompt(2), 2)) == "r1"
    assert ledger.claimed("r0") == 0


def test_the_scorer_is_neutral_without_a_view_or_for_a_held_group_whose_home_fits() -> None:
    scorer = KvFitScorer()
    candidates = [ReplicaState(name=n, url="", pool="m") for n in NAMES]
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=1, max_tokens=1,
                       prefix_keys=prompt(1))  # fmt: skip
    ctx = SchedulingContext(request=info, now=0.0, prefix_match={}, prefix_blocks=5)
    assert list(scorer.score(ctx, candidates)) == [1.0, 1.0]
    ledger = GroupLedger()
    ledger.record(prompt(1), "r0", 0, 0.0)
    ledger.record(prompt(1), "r1", 0, 0.0, held_on_home=4)  # a spill: r0 held it, r1 took a copy
    view = ledger.fit_view(prompt(1), {"r0": CAPACITY, "r1": CAPACITY}, 0.0)
    held = SchedulingContext(request=info, now=0.0, prefix_match={"r0": 4, "r1": 4}, prefix_blocks=5,
                             kv_fit=view)  # fmt: skip
    assert list(scorer.score(held, candidates)) == [1.0, 1.0]


def test_scorer_params_are_checked() -> None:
    with pytest.raises(ValueError, match="other"):
        KvFitScorer(other=1.5)
    with pytest.raises(ValueError, match="usable"):
        GroupLedger(usable=0.0)


def test_counts_per_replica_after_a_mixed_run_stay_consistent() -> None:
    loop = Loop(seed=3)
    rng = random.Random(3)
    for _ in range(200):
        loop.send(prompt(rng.randrange(12)), {n: rng.randrange(4) for n in NAMES})
    homes = Counter(loop.ledger.home_of(group_key(prompt(g), 2)) for g in range(12))
    assert {n: loop.ledger.groups_on(n) for n in NAMES} == {n: homes[n] for n in NAMES}
    claimed = sum(loop.ledger.claimed(n) for n in NAMES)
    assert claimed == pytest.approx(12 * SHARED)


def test_a_new_group_is_not_sent_to_the_replica_home_to_more_groups_for_claiming_fewer_blocks() -> None:
    # r0 is home to 3 confirmed groups (4 blocks each: 12); r1 to 2 groups seen once, each claiming
    # its whole 8-block prompt (16), unique tail included. By blocks alone r0 led the new group; it
    # would then hold 4 groups to r1's 2.
    ledger = GroupLedger()
    for g in range(3):
        ledger.record(prompt(g), "r0", 0, 0.0)
        ledger.record(prompt(g), "r0", SHARED, 0.1)
    for g in (10, 11):
        ledger.record((*prompt(g)[:SHARED], *(next(_unique) for _ in range(4))), "r1", 0, 0.2)
    assert (ledger.claimed("r0"), ledger.claimed("r1")) == (12.0, 16.0)
    keys = prompt(20)
    view = ledger.fit_view(keys, {n: CAPACITY for n in NAMES}, 0.3)
    assert view is not None and dict(view.homed) == {"r0": 3, "r1": 2}
    info = RequestInfo(
        model="m", base_model="m", adapter=None, prompt_tokens=1, max_tokens=1, prefix_keys=keys
    )
    ctx = SchedulingContext(request=info, now=0.3, prefix_match={}, prefix_blocks=len(keys), kv_fit=view)
    r0, r1 = KvFitScorer().score(ctx, [ReplicaState(name=n, url="", pool="m") for n in NAMES])
    assert r0 <= r1
