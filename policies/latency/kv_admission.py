"""KV-block admission: how long a request waits in a replica's queue for free KV blocks.

vLLM's scheduler (and the simulator's, `simulator/scheduler.py`) admits the head of its waiting queue
only when the blocks its prompt needs fit the free KV, where "free" counts cached prefix blocks no
running request references (they are evicted to make room). A prompt that does not fit waits until
running requests finish and free theirs, and everything queued behind it waits too (FCFS). The
prefill rate of a replica says nothing about that wait; this module predicts it from what kvgate's
dispatch ledger knows about the requests it sent there.

The ledger (`KvLedger`, one per replica) holds each in-flight request of kvgate's: its prompt and
predicted output tokens (the output cap: what the engine may generate before it frees the blocks),
when its first token came (or is predicted to come), and the prefix group it shares blocks with.
Blocks are counted as the engine counts them:

- a request holds ceil((prompt + tokens generated so far) / block size) blocks;
- requests of one prefix group reference the group's prefix blocks once: a group is keyed by the
  first prefix key, its first member's keys are the group's, and each member shares the leading
  keys it has in common with them (`shared` blocks). The blocks a set of requests holds is then
  sum(blocks - shared) + the largest `shared` of each group's members in the set (exact for
  members sharing a prefix of the first's);
- the new request needs its blocks taken from the free pool even where the replica has them cached
  but unreferenced (the engine takes evictable hits out of the free pool as well), so only sharing
  with requests in flight lowers what it needs.

`admission_wait_s` plays the replica's queue forward: the requests whose first token came are
running and free their blocks at their predicted end: the replica's steps kvgate sees (a chunk of
one of its streams ends each) count the tokens each has generated, one per step since the step of
its first token, so it ends its remaining output tokens' steps (x the predicted time per output
token) after the last step seen, the next of them not before the step under way is predicted to end
(a step carrying a long prefill runs late, and no running request ends before it does); where no
steps are seen, first token + output tokens x that time.
Counting steps rather than time keeps the end right when steps run long (a cold prompt's prefill
stalls every decode in its step), which dating by time alone missed. The others are queued ahead of
the new request in dispatch order (FCFS; one already admitted but still prefilling is admitted at
once by the play, as it fits), each admitted as soon as it fits and then holding its blocks for its
prefill and output; the new request is admitted when it fits beside what is held then. Its TTFT is
that wait, then its prefill with the queued requests admitted at the same instant
(`LatencyEstimator.predict`). Queued requests are not dated by their own tickets' TTFTs: those came
from a prefill fit that absorbs queueing, and chaining them compounded the error. With the capacity
unknown (no scrape of `vllm:cache_config_info` yet) there is no wait term.

Pure: no I/O, no clock (callers pass `now`). A read costs O(n) over the replica's requests in
flight when they and the new request all fit (the common unloaded case: one pass, no play), else
O(n log n); it is made once per dispatch (the ticket), not per routing candidate.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# An entry whose predicted end passed this long ago is taken as lost (its end was never reported):
# the ledger lets it go at the next read rather than hold its blocks forever.
LOST_AFTER_S = 600.0


class Held(NamedTuple):
    """One request's claim on a replica's KV at a read: `blocks`, `shared` of them referenced with the
    other members of prefix group `group` (None: shares nothing). A running request frees them at
    `end_at`; a queued one, `duration` seconds after it is admitted, and has `tokens` to prefill.
    A named tuple, not a frozen dataclass: a read builds one per request in flight, and a tuple is
    several times cheaper to build."""

    end_at: float
    blocks: int
    group: int | None = None
    shared: int = 0
    duration: float = 0.0
    tokens: int = 0


def held_blocks(requests: Sequence[Held]) -> int:
    """Blocks `requests` hold together: each group's shared prefix counted once (module docstring)."""
    pool = _Pool()
    pool.add_all(requests)
    return pool.total


class _Pool:
    """The blocks a changing set of requests holds (`held_blocks`, kept as requests come and go).
    Per group: how many members share each prefix length, and the largest (the group's blocks)."""

    __slots__ = ("_groups", "_private", "_shared", "total")

    def __init__(self) -> None:
        self._private = 0
        self._shared = 0
        self._groups: dict[int, tuple[dict[int, int], int]] = {}  # group -> (shared -> count, top)
        self.total = 0

    def with_(self, r: Held) -> int:
        """`total` if `r` joined."""
        if r.group is None or r.shared <= 0:
            return self.total + r.blocks
        known = self._groups.get(r.group)
        top = known[1] if known is not None else 0
        return self.total + r.blocks - r.shared + (r.shared - top if r.shared > top else 0)

    def add_all(self, requests: Sequence[Held]) -> None:
        """`add` each of `requests` (one loop, not a call per request: a play adds every running
        request of its replica)."""
        private, shared_total, groups = self._private, self._shared, self._groups
        for r in requests:
            group, shared = r.group, r.shared
            if group is None or shared <= 0:
                private += r.blocks
                continue
            private += r.blocks - shared
            known = groups.get(group)
            if known is None:
                groups[group] = ({shared: 1}, shared)
                shared_total += shared
                continue
            counts, top = known
            counts[shared] = counts.get(shared, 0) + 1
            if shared > top:
                shared_total += shared - top
                groups[group] = (counts, shared)
        self._private, self._shared = private, shared_total
        self.total = private + shared_total

    def add(self, r: Held) -> None:
        self.add_all((r,))

    def free_until_fits(
        self, r: Held, capacity_blocks: int, ends: list[tuple[float, int, Held]], t: float, now: float,
        limit_s: float,
    ) -> float:  # fmt: skip
        """Pop `ends` (a heap of (end, order, request) of requests in the pool) earliest first and
        take each out of the pool until `r` fits beside what is left (`with_`) or `ends` is empty;
        return the time the last one popped ends, or `t` if later. Stops early once that is more
        than `limit_s` after `now`. One loop, `with_` inlined: a play pops up to every request of
        its replica."""
        private, shared_total, groups = self._private, self._shared, self._groups
        group, shared, blocks = r.group, r.shared, r.blocks
        if shared <= 0:
            group = None
        pop = heapq.heappop
        while ends:
            total = private + shared_total + blocks
            if group is not None:
                known = groups.get(group)
                top = known[1] if known is not None else 0
                total -= shared - (shared - top if shared > top else 0)
            if total <= capacity_blocks:
                break
            end, _, done = pop(ends)
            d_group, d_shared = done.group, done.shared
            if d_group is None or d_shared <= 0:
                private -= done.blocks
            else:
                private -= done.blocks - d_shared
                counts, top = groups[d_group]
                left = counts[d_shared] - 1
                if left:
                    counts[d_shared] = left
                else:
                    del counts[d_shared]
                if not counts:
                    del groups[d_group]
                    shared_total -= top
                elif d_shared == top and not left:
                    new_top = max(counts)
                    shared_total -= top - new_top
                    groups[d_group] = (counts, new_top)
            if end > t:
                t = end
                if t - now > limit_s:
                    break
        self._private, self._shared = private, shared_total
        self.total = private + shared_total
        return t


def admission_wait_s(
    now: float, running: Sequence[Held], queued: Sequence[Held], new: Held, capacity_blocks: int,
    limit_s: float = math.inf,
) -> tuple[float, int]:  # fmt: skip
    """When `new`, queued behind `queued` (FCFS, in that order), is admitted on a replica of
    `capacity_blocks` blocks where `running` hold theirs: (seconds from `now`, the prefill tokens of
    the queued requests admitted at the same instant, which share its first steps).

    The engine's queue played forward: the head is admitted as soon as it fits beside what is held
    (then it holds its blocks for its `duration`), else the earliest end frees its blocks. A request
    that does not fit even alone is admitted once nothing else is held. (0, 0) when
    `capacity_blocks` is unknown (<= 0).

    `limit_s`: a caller that only needs to know whether the wait is over it gets, as soon as the play
    passes it, (a wait over `limit_s` but no more than the true one, 0) instead of the rest of the
    play (the latency gate: a replica that far off takes nothing and cannot have the pool's least
    drain)."""
    if capacity_blocks <= 0:
        return 0.0, 0
    pool = _Pool()
    pool.add_all(running)
    # Until something does not fit, every request is admitted at `now` and nothing ends: the heap of
    # ends is built only then (its pops are ordered by the unique (end, order) keys, so building it
    # late pops them in the same order as pushing them one by one).
    ends: list[tuple[float, int, Held]] | None = None
    admitted: list[Held] = []
    order = len(running)
    t = now
    batch_at, batch_tokens = now, 0  # the queued requests admitted at `batch_at` (their prefill)
    for r in (*queued, new):
        if ends is None and pool.with_(r) > capacity_blocks:
            ends = [(h.end_at, i, h) for i, h in enumerate(running)]
            ends += [(now + h.duration, len(running) + 1 + j, h) for j, h in enumerate(admitted)]
            heapq.heapify(ends)
        if ends:
            t = pool.free_until_fits(r, capacity_blocks, ends, t, now, limit_s)
            if t - now > limit_s:
                return t - now, 0
        if r is new:
            return t - now, batch_tokens if batch_at == t else 0
        if batch_at != t:
            batch_at, batch_tokens = t, 0
        batch_tokens += r.tokens
        pool.add(r)
        order += 1
        if ends is None:
            admitted.append(r)
        else:
            heapq.heappush(ends, (t + r.duration, order, r))
    raise AssertionError("unreachable: `new` is the last of the loop")


@dataclass(slots=True)
class _Entry:
    prompt_tokens: int
    output_tokens: int
    uncached_tokens: int  # to prefill (as predicted at dispatch)
    first_at: float  # predicted first token (replaced by the observed one when it comes)
    observed: bool  # `first_at` is the observed first token
    group: int | None
    shared_tokens: int  # leading tokens in common with the group's first member
    # The ledger's step count that produced its first token (`KvLedger.step_seen`); None: steps not
    # seen, its tokens generated are dated by the predicted time per output token instead.
    first_step: int | None = None


def _generated(e: _Entry, now: float, tpot_s: float, steps: int) -> int:
    """Output tokens `e` (running) has generated by `now`: one per step of its replica since the one
    that produced its first token (each step decodes one token of every running request), or, with
    no steps seen, the time since its first token over `tpot_s`; at most its output tokens."""
    if e.first_step is not None:
        generated = 1 + steps - e.first_step
    elif now > e.first_at and tpot_s > 0:
        generated = int((now - e.first_at) / tpot_s) + 1
    else:
        return 0
    return generated if generated < e.output_tokens else e.output_tokens


def _blocks_now(e: _Entry, now: float, tpot_s: float, block_size: int, steps: int) -> int:
    """The blocks `e` holds at `now` (its prompt's while queued; with the tokens generated by now once
    its first token came), or -1 when it is lost: its predicted end (first token + output tokens x
    `tpot_s`) passed more than `LOST_AFTER_S` ago. One rule for `KvLedger.held` (inlined there) and
    its fast path."""
    if e.first_at + e.output_tokens * tpot_s + LOST_AFTER_S < now:
        return -1
    if not e.observed:
        return -(-e.prompt_tokens // block_size)
    return -(-(e.prompt_tokens + _generated(e, now, tpot_s, steps)) // block_size)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KvLedger:
    """kvgate's requests in flight on one replica, as their KV blocks (module docstring). Mutable;
    keyed by the caller's ident (`LatencyEstimator` numbers its tickets)."""

    __slots__ = ("_entries", "_groups", "_most_tokens", "key_tokens", "step_at", "steps")

    def __init__(self, key_tokens: int) -> None:
        if key_tokens < 1:
            raise ValueError(f"key_tokens must be >= 1, got {key_tokens}")
        self.key_tokens = key_tokens  # tokens per prefix key (the prefix index's block)
        self._entries: dict[int, _Entry] = {}
        # group (its first key) -> (the group's keys: its first member's, members in the ledger)
        self._groups: dict[int, tuple[tuple[int, ...], int]] = {}
        self.steps = 0  # steps of the replica seen (`step_seen`)
        self.step_at: float | None = None  # when the last of them ended
        self._most_tokens = 0  # the entries' prompt + output tokens (`fits_at_full_length`)

    def __len__(self) -> int:
        return len(self._entries)

    def shared_tokens(self, prefix_keys: Sequence[int]) -> int:
        """Leading tokens a prompt with `prefix_keys` shares with its group's requests in flight."""
        if not prefix_keys:
            return 0
        group = self._groups.get(prefix_keys[0])
        if group is None:
            return 0
        return _common_prefix(prefix_keys, group[0]) * self.key_tokens

    def group_in_flight(self, prefix_keys: Sequence[int], min_shared_keys: int) -> int:
        """Requests in flight of the group a prompt with `prefix_keys` belongs to (its first key),
        when the prompt shares at least `min_shared_keys` leading keys with the group (else 0)."""
        if not prefix_keys:
            return 0
        group = self._groups.get(prefix_keys[0])
        if group is None:
            return 0
        n = max(min_shared_keys, 1)
        keys = group[0]
        if n > len(keys) or n > len(prefix_keys) or tuple(prefix_keys[:n]) != keys[:n]:  # one compare, in C
            return 0
        return group[1]

    def add(self, ident: int, prompt_tokens: int, output_tokens: int, first_at: float,
            prefix_keys: Sequence[int] = (), uncached_tokens: int = 0) -> None:  # fmt: skip
        """Request `ident` was sent: `prompt_tokens` to hold, up to `output_tokens` to generate, its
        first token predicted at `first_at`. Adding an ident already held replaces it."""
        if ident in self._entries:
            self.remove(ident)
        group: int | None = None
        shared = 0
        if prefix_keys:
            group = prefix_keys[0]
            known = self._groups.get(group)
            if known is None:
                keys = tuple(prefix_keys)
                self._groups[group] = (keys, 1)
                shared = len(keys) * self.key_tokens
            else:
                shared = _common_prefix(prefix_keys, known[0]) * self.key_tokens
                self._groups[group] = (known[0], known[1] + 1)
        entry = _Entry(prompt_tokens, max(output_tokens, 1), uncached_tokens, first_at, False, group,
                       min(shared, prompt_tokens))  # fmt: skip
        self._entries[ident] = entry
        self._most_tokens += entry.prompt_tokens + entry.output_tokens

    def first_token(self, ident: int, at: float) -> None:
        """Request `ident`'s first token came at `at`: it is running, its end dates from `at`."""
        entry = self._entries.get(ident)
        if entry is not None:
            entry.first_at = at
            entry.observed = True
            if self.step_at is not None:
                # the step that ended at `at` is counted already, or is the next to be
                entry.first_step = self.steps if self.step_at >= at else self.steps + 1

    def step_seen(self, at: float) -> None:
        """A step of the replica ended at `at` (once per step): each running request generated one
        more token, so a running request's end is its remaining output tokens' steps away."""
        self.steps += 1
        self.step_at = at

    def remove(self, ident: int) -> None:
        """Request `ident` ended (whatever the outcome): its blocks are free. Unknown idents: no-op."""
        entry = self._entries.pop(ident, None)
        if entry is None:
            return
        self._most_tokens -= entry.prompt_tokens + entry.output_tokens
        if entry.group is None:
            return
        keys, members = self._groups[entry.group]
        if members <= 1:
            del self._groups[entry.group]
        else:
            self._groups[entry.group] = (keys, members - 1)

    def fits_at_full_length(self, block_size: int, capacity_blocks: int, prompt_tokens: int) -> bool:
        """True when a new `prompt_tokens` prompt fits beside every request in flight even if each
        held the blocks of its whole prompt and output cap, no prefix shared: then `wait_s` is 0
        whatever the time. O(1) (a running sum), against a pass over the ledger for `wait_s`'s own
        check (~19 us at 64 in flight: docs/benchmarks.md, "The latency gate and the KV blocks")."""
        if block_size < 1:
            return False
        most = (self._most_tokens + len(self._entries) * (block_size - 1)) // block_size
        return most + -(-prompt_tokens // block_size) <= capacity_blocks

    def held(self, now: float, tpot_s: float, block_size: int, prefill_s_per_token: float = 0.0,
             next_step_at: float | None = None) -> tuple[list[Held], list[Held]]:  # fmt: skip
        """(running, queued) at `now`. Running: the requests whose first token came; they hold blocks
        for their prompt and the tokens generated by now (counted by the steps seen, `step_seen`), and
        free them when their remaining output tokens' steps are done: the next step ends at the last
        step seen + `tpot_s`, but not before `now` nor `next_step_at` (the caller's prediction of
        when the step under way ends: a step that carries a long prefill runs late, and every
        running request's end waits for it), the others `tpot_s` apart (without steps seen: at their
        first token + output tokens x `tpot_s`, not before `now`). Queued: the others,
        in dispatch order (the engine's FCFS), each holding its prompt's blocks for its prefill
        (`prefill_s_per_token`) and output once admitted. Drops entries lost long ago
        (`LOST_AFTER_S`)."""
        running: list[Held] = []
        queued: list[Held] = []
        lost: list[int] = []
        steps, step_at = self.steps, self.step_at
        floor = next_step_at if next_step_at is not None and next_step_at > now else now
        # `_blocks_now` and `_generated` inlined (one read builds a `Held` per request in flight);
        # tests/policies/latency/test_kv_admission_equivalence.py holds this to the plain calls
        for ident, e in self._entries.items():
            out = e.output_tokens
            decode = out * tpot_s
            if e.first_at + decode + LOST_AFTER_S < now:
                lost.append(ident)
                continue
            shared = e.shared_tokens // block_size
            if not e.observed:
                duration = e.uncached_tokens * prefill_s_per_token + decode
                queued.append(Held(now, -(-e.prompt_tokens // block_size), e.group, shared, duration,
                                   e.uncached_tokens))  # fmt: skip
                continue
            first_step = e.first_step
            if first_step is not None:
                generated = 1 + steps - first_step
            elif now > e.first_at and tpot_s > 0:
                generated = int((now - e.first_at) / tpot_s) + 1
            else:
                generated = 0
            if generated > out:
                generated = out
            blocks = -(-(e.prompt_tokens + generated) // block_size)
            if first_step is not None and step_at is not None:
                # its remaining output tokens, one per step from the last step seen, the next of
                # those ending no earlier than `floor`
                left = out - generated
                if left > 0:
                    nxt = step_at + tpot_s
                    end = (nxt if nxt > floor else floor) + (left - 1) * tpot_s
                else:
                    end = step_at
            else:
                end = e.first_at + decode
            running.append(Held(end if end > now else now, blocks, e.group, shared))
        for ident in lost:
            self.remove(ident)
        return running, queued

    def wait_s(self, now: float, tpot_s: float, block_size: int, capacity_blocks: int,
               prompt_tokens: int, prefix_keys: Sequence[int] = (),
               prefill_s_per_token: float = 0.0, limit_s: float = math.inf,
               next_step_at: float | None = None) -> tuple[float, int]:  # fmt: skip
        """`admission_wait_s` of a new `prompt_tokens` prompt with `prefix_keys` behind this ledger's
        requests, on a replica of `capacity_blocks` blocks of `block_size` tokens (cut short past
        `limit_s`, as there; the running requests' ends as `held` dates them, `next_step_at` too)."""
        if capacity_blocks <= 0 or block_size < 1 or not self._entries:
            return 0.0, 0
        group = prefix_keys[0] if prefix_keys else None
        shared = min(self.shared_tokens(prefix_keys), prompt_tokens) // block_size
        if group is None:
            shared = 0
        fits = self._all_fit(now, tpot_s, block_size, capacity_blocks,
                             -(-prompt_tokens // block_size), group, shared)  # fmt: skip
        if fits is not None:
            return 0.0, fits
        new = Held(now, -(-prompt_tokens // block_size), group, shared)
        running, queued = self.held(now, tpot_s, block_size, prefill_s_per_token, next_step_at)
        return admission_wait_s(now, running, queued, new, capacity_blocks, limit_s)

    def _all_fit(self, now: float, tpot_s: float, block_size: int, capacity_blocks: int,
                 new_blocks: int, new_group: int | None, new_shared: int) -> int | None:  # fmt: skip
        """The common unloaded case of `wait_s` without building `Held`s or playing the queue: when
        every request in flight and the new one fit the capacity together, nothing waits (all the
        queued are admitted at `now` beside it), so the answer is (0, the queued's prefill tokens);
        this returns those tokens, or None as soon as the blocks counted pass the capacity (the
        blocks held only grow as requests join, so then some admission waits: play it). Counts the
        blocks exactly as `held` and `_Pool` do, and drops the lost entries as `held` does."""
        tops: dict[int, int] = {}  # group -> the largest shared prefix (blocks) of its members
        if new_group is None or new_shared <= 0:
            private, shared_total = new_blocks, 0
        else:
            private, shared_total = new_blocks - new_shared, new_shared
            tops[new_group] = new_shared
        tokens = 0
        lost: list[int] = []
        for ident, e in self._entries.items():
            blocks = _blocks_now(e, now, tpot_s, block_size, self.steps)
            if blocks < 0:
                lost.append(ident)
                continue
            if not e.observed:
                tokens += e.uncached_tokens
            shared = e.shared_tokens // block_size
            if e.group is None or shared <= 0:
                private += blocks
            else:
                private += blocks - shared
                top = tops.get(e.group, 0)
                if shared > top:
                    tops[e.group] = shared
                    shared_total += shared - top
            if private + shared_total > capacity_blocks:
                return None
        for ident in lost:
            self.remove(ident)
        return tokens
