"""`KvLedger.wait_s`'s fast paths (one pass when everything fits; the play's heap built only once
something does not fit) answer exactly as the plain play did: the plain one is kept here as the
reference and both are run on random ledgers."""

from __future__ import annotations

import copy
import heapq
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.latency.kv_admission import (
    LOST_AFTER_S,
    Held,
    KvLedger,
    _blocks_now,
    _generated,
    _Pool,
    admission_wait_s,
)

BS = 16


class ReferencePool:
    """`kv_admission._Pool` as it was before its pops became one loop (4873155): a request joins
    (`add`) and leaves (`remove`) at a time, and `with_` is a call."""

    def __init__(self) -> None:
        self._private = 0
        self._shared = 0
        self._groups: dict[int, tuple[dict[int, int], int]] = {}
        self.total = 0

    def with_(self, r: Held) -> int:
        if r.group is None or r.shared <= 0:
            return self.total + r.blocks
        known = self._groups.get(r.group)
        top = known[1] if known is not None else 0
        return self.total + r.blocks - r.shared + (r.shared - top if r.shared > top else 0)

    def add(self, r: Held) -> None:
        if r.group is None or r.shared <= 0:
            self._private += r.blocks
        else:
            self._private += r.blocks - r.shared
            counts, top = self._groups.get(r.group) or ({}, 0)
            counts[r.shared] = counts.get(r.shared, 0) + 1
            if r.shared > top:
                self._shared += r.shared - top
                top = r.shared
            self._groups[r.group] = (counts, top)
        self.total = self._private + self._shared

    def remove(self, r: Held) -> None:
        if r.group is None or r.shared <= 0:
            self._private -= r.blocks
        else:
            self._private -= r.blocks - r.shared
            counts, top = self._groups[r.group]
            left = counts[r.shared] - 1
            if left:
                counts[r.shared] = left
            else:
                del counts[r.shared]
            if not counts:
                del self._groups[r.group]
                self._shared -= top
            elif r.shared == top and not left:
                new_top = max(counts)
                self._shared -= top - new_top
                self._groups[r.group] = (counts, new_top)
        self.total = self._private + self._shared


def reference_admission_wait_s(
    now: float, running: Sequence[Held], queued: Sequence[Held], new: Held, capacity_blocks: int
) -> tuple[float, int]:
    """`admission_wait_s` as merged with kv-admit (commit f99a4c1): every end in a heap up front."""
    if capacity_blocks <= 0:
        return 0.0, 0
    pool = ReferencePool()
    ends: list[tuple[float, int, Held]] = []
    for i, r in enumerate(running):
        pool.add(r)
        ends.append((r.end_at, i, r))
    heapq.heapify(ends)
    order = len(running)
    t = now
    batch_at, batch_tokens = now, 0
    for r in [*queued, new]:
        while ends and pool.with_(r) > capacity_blocks:
            end, _, done = heapq.heappop(ends)
            pool.remove(done)
            if end > t:
                t = end
        if r is new:
            return t - now, batch_tokens if batch_at == t else 0
        if batch_at != t:
            batch_at, batch_tokens = t, 0
        batch_tokens += r.tokens
        pool.add(r)
        order += 1
        heapq.heappush(ends, (t + r.duration, order, r))
    raise AssertionError("unreachable")


def reference_held(ledger: KvLedger, now: float, tpot_s: float, block_size: int,
                   prefill_s_per_token: float, next_step_at: float | None = None,
                   ) -> tuple[list[Held], list[Held]]:  # fmt: skip
    """`KvLedger.held` as it was before `_blocks_now` and `_generated` were inlined there (4873155):
    a call of each per request (lost entries dropped the same way); with the running requests' next
    step dated no earlier than `now` and `next_step_at` since."""
    floor = max(now, next_step_at) if next_step_at is not None else now
    running: list[Held] = []
    queued: list[Held] = []
    lost: list[int] = []
    for ident, e in ledger._entries.items():
        shared = e.shared_tokens // block_size
        decode = e.output_tokens * tpot_s
        blocks = _blocks_now(e, now, tpot_s, block_size, ledger.steps)
        if blocks < 0:
            lost.append(ident)
        elif not e.observed:
            duration = e.uncached_tokens * prefill_s_per_token + decode
            queued.append(Held(now, blocks, e.group, shared, duration, e.uncached_tokens))
        elif e.first_step is not None and ledger.step_at is not None:
            left = e.output_tokens - _generated(e, now, tpot_s, ledger.steps)
            if left > 0:
                end = max(ledger.step_at + tpot_s, floor) + (left - 1) * tpot_s
            else:
                end = ledger.step_at
            running.append(Held(end if end > now else now, blocks, e.group, shared))
        else:
            end = e.first_at + decode
            running.append(Held(end if end > now else now, blocks, e.group, shared))
    for ident in lost:
        ledger.remove(ident)
    return running, queued


def reference_wait_s(ledger: KvLedger, now: float, tpot_s: float, block_size: int,
                     capacity_blocks: int, prompt_tokens: int, prefix_keys: Sequence[int],
                     prefill_s_per_token: float, next_step_at: float | None = None,
                     ) -> tuple[float, int]:  # fmt: skip
    """`KvLedger.wait_s` as merged with kv-admit: always `held` then the full play."""
    if capacity_blocks <= 0 or block_size < 1 or not len(ledger):
        return 0.0, 0
    group = prefix_keys[0] if prefix_keys else None
    shared = min(ledger.shared_tokens(prefix_keys), prompt_tokens) // block_size
    new = Held(now, -(-prompt_tokens // block_size), group, shared if group is not None else 0)
    running, queued = reference_held(ledger, now, tpot_s, block_size, prefill_s_per_token, next_step_at)
    return reference_admission_wait_s(now, running, queued, new, capacity_blocks)


keys = st.lists(st.integers(0, 2), min_size=0, max_size=12)
entry = st.tuples(
    st.integers(1, 4000),  # prompt tokens
    st.integers(0, 600),  # output tokens
    st.floats(0.0, 3.0),  # predicted first token
    keys,
    st.integers(0, 4000),  # uncached tokens
    st.one_of(st.none(), st.floats(0.0, 2.0)),  # observed first token
)


@settings(max_examples=600, deadline=None)
@given(
    entries=st.lists(entry, max_size=40),
    now=st.one_of(st.floats(0.0, 4.0), st.just(LOST_AFTER_S + 20.0)),
    tpot=st.sampled_from([0.0, 0.005, 0.02, 0.05]),
    block_size=st.sampled_from([1, 16, 32]),
    capacity=st.integers(-1, 6000),
    prompt=st.integers(1, 6000),
    new_keys=keys,
    prefill=st.sampled_from([0.0, 1e-4, 1e-3]),
    steps=st.lists(st.floats(0.0, 3.0), max_size=30),
    next_step=st.one_of(st.none(), st.floats(0.0, 0.5)),
)
def test_wait_s_answers_as_the_reference_play(
    entries: list[tuple[int, int, float, list[int], int, float | None]], now: float, tpot: float,
    block_size: int, capacity: int, prompt: int, new_keys: list[int], prefill: float,
    steps: list[float], next_step: float | None,
) -> None:  # fmt: skip
    ledger = KvLedger(key_tokens=16)
    for ident, (p, out, first, ks, uncached, _) in enumerate(entries):
        ledger.add(ident, p, out, first, ks, uncached)
    # First tokens and steps seen in time order (the running requests' tokens counted by steps).
    seen = [(at, 1, ident) for ident, (*_, at) in enumerate(entries) if at is not None]
    for at, kind, ident in sorted([*seen, *((at, 0, -1) for at in steps)]):
        if kind:
            ledger.first_token(ident, at)
        else:
            ledger.step_seen(at)
    before = copy.deepcopy(ledger)
    at = None if next_step is None else now + next_step  # the step under way's predicted end
    assert copy.deepcopy(ledger).held(now, tpot, block_size, prefill, at) == reference_held(
        copy.deepcopy(ledger), now, tpot, block_size, prefill, at
    )
    got = ledger.wait_s(now, tpot, block_size, capacity, prompt, new_keys, prefill, next_step_at=at)
    want = reference_wait_s(before, now, tpot, block_size, capacity, prompt, new_keys, prefill, at)
    assert got == want
    assert len(ledger) == len(before)  # the same lost entries dropped


running_or_queued = st.tuples(
    st.floats(0.0, 10.0), st.integers(0, 300), st.one_of(st.none(), st.integers(0, 2)),
    st.integers(0, 300), st.floats(0.0, 5.0), st.integers(0, 3000),
)  # fmt: skip


def _held(t: tuple[float, int, int | None, int, float, int]) -> Held:
    end_at, blocks, group, shared, duration, tokens = t
    return Held(end_at, blocks, group, min(shared, blocks), duration, tokens)


@settings(max_examples=600, deadline=None)
@given(
    running=st.lists(running_or_queued, max_size=30),
    queued=st.lists(running_or_queued, max_size=20),
    new=running_or_queued,
    capacity=st.integers(-1, 3000),
)
def test_admission_wait_s_answers_as_the_reference_play(
    running: list[tuple[float, int, int | None, int, float, int]],
    queued: list[tuple[float, int, int | None, int, float, int]],
    new: tuple[float, int, int | None, int, float, int],
    capacity: int,
) -> None:
    r = [_held(x) for x in running]
    q = [_held(x) for x in queued]
    n = _held(new)
    assert admission_wait_s(0.0, r, q, n, capacity) == reference_admission_wait_s(0.0, r, q, n, capacity)


@settings(max_examples=400, deadline=None)
@given(
    requests=st.lists(running_or_queued, max_size=40),
    joined=st.lists(running_or_queued, max_size=10),
    new=running_or_queued,
    capacity=st.integers(0, 3000),
    limit=st.one_of(st.just(float("inf")), st.floats(0.0, 10.0)),
)
def test_a_pool_s_one_loop_forms_leave_it_as_one_request_at_a_time_does(
    requests: list[tuple[float, int, int | None, int, float, int]],
    joined: list[tuple[float, int, int | None, int, float, int]],
    new: tuple[float, int, int | None, int, float, int],
    capacity: int,
    limit: float,
) -> None:
    """`_Pool.add_all` leaves the pool that `add` one request at a time leaves, and
    `_Pool.free_until_fits` the pool (and the time) that popping and removing one at a time until the
    new request fits leaves, limit included."""
    held = [_held(x) for x in requests]
    pool, ref = _Pool(), ReferencePool()
    pool.add_all(held)
    for r in held:
        ref.add(r)
    for r in (_held(x) for x in joined):
        pool.add(r)
        ref.add(r)
        held.append(r)
    assert (pool.total, pool._groups) == (ref.total, ref._groups)
    n = _held(new)
    ends = [(r.end_at, i, r) for i, r in enumerate(held)]
    heapq.heapify(ends)
    ref_ends = list(ends)
    t = pool.free_until_fits(n, capacity, ends, 0.0, 0.0, limit)
    ref_t = 0.0
    while ref_ends and ref.with_(n) > capacity:
        end, _, done = heapq.heappop(ref_ends)
        ref.remove(done)
        if end > ref_t:
            ref_t = end
            if ref_t > limit:
                break
    assert (t, pool.total, pool._groups, ends) == (ref_t, ref.total, ref._groups, ref_ends)
