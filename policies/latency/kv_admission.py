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

`admission_wait_s`: the requests in flight (running, or queued ahead of the new one: they are
admitted first) end in order of their predicted end (first token + output tokens x the predicted
time per output token); the new request is admitted at the first end after which it and everything
still in flight fit the replica's blocks. With the capacity unknown (no scrape of
`vllm:cache_config_info` yet) there is no wait term.

Pure: no I/O, no clock (callers pass `now`). A read costs O(n log n) over the replica's
requests in flight; it is made once per dispatch (the ticket), not per routing candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# An entry whose predicted end passed this long ago is taken as lost (its end was never reported):
# the ledger lets it go at the next read rather than hold its blocks forever.
LOST_AFTER_S = 600.0


@dataclass(frozen=True, slots=True)
class Held:
    """One request's claim on a replica's KV at a read: it frees `blocks` at `end_at`, `shared` of
    them referenced with the other members of prefix group `group` (None: shares nothing)."""

    end_at: float
    blocks: int
    group: int | None = None
    shared: int = 0


def held_blocks(requests: Sequence[Held]) -> int:
    """Blocks `requests` hold together: each group's shared prefix counted once (module docstring)."""
    total = 0
    shared: dict[int, int] = {}
    for r in requests:
        if r.group is None or r.shared <= 0:
            total += r.blocks
            continue
        total += r.blocks - r.shared
        if shared.get(r.group, 0) < r.shared:
            shared[r.group] = r.shared
    return total + sum(shared.values())


def admission_wait_s(now: float, in_flight: Sequence[Held], new: Held, capacity_blocks: int) -> float:
    """Seconds from `now` until `new` can be admitted: 0 when it fits beside everything `in_flight`;
    else until enough of them (earliest predicted end first) have ended. 0 when `capacity_blocks` is
    unknown (<= 0). A request too large for the replica even alone waits for all of them."""
    if capacity_blocks <= 0:
        return 0.0
    order = sorted(in_flight, key=lambda r: r.end_at)
    # held[j]: blocks that `new` and the requests still in flight once order[:j] ended hold together,
    # built from the latest end backwards (a group's shared blocks: the largest seen so far).
    n = len(order)
    held = [0] * (n + 1)
    private = 0
    shared: dict[int, int] = {}
    shared_total = 0
    for j in range(n, -1, -1):
        r = new if j == n else order[j]
        if r.group is None or r.shared <= 0:
            private += r.blocks
        else:
            private += r.blocks - r.shared
            top = shared.get(r.group, 0)
            if top < r.shared:
                shared[r.group] = r.shared
                shared_total += r.shared - top
        held[j] = private + shared_total
    if held[0] <= capacity_blocks:
        return 0.0
    for j in range(1, n + 1):
        if held[j] <= capacity_blocks:
            return max(order[j - 1].end_at - now, 0.0)
    return max(order[-1].end_at - now, 0.0) if order else 0.0


@dataclass(slots=True)
class _Entry:
    prompt_tokens: int
    output_tokens: int
    uncached_tokens: int  # to prefill (as predicted at dispatch)
    first_at: float  # predicted first token (replaced by the observed one when it comes)
    observed: bool  # `first_at` is the observed first token
    group: int | None
    shared_tokens: int  # leading tokens in common with the group's first member


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KvLedger:
    """kvgate's requests in flight on one replica, as their KV blocks (module docstring). Mutable;
    keyed by the caller's ident (`LatencyEstimator` numbers its tickets)."""

    __slots__ = ("_entries", "_groups", "key_tokens")

    def __init__(self, key_tokens: int) -> None:
        if key_tokens < 1:
            raise ValueError(f"key_tokens must be >= 1, got {key_tokens}")
        self.key_tokens = key_tokens  # tokens per prefix key (the prefix index's block)
        self._entries: dict[int, _Entry] = {}
        # group (its first key) -> (the group's keys: its first member's, members in the ledger)
        self._groups: dict[int, tuple[tuple[int, ...], int]] = {}

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
        self._entries[ident] = _Entry(prompt_tokens, max(output_tokens, 1), uncached_tokens, first_at,
                                      False, group, min(shared, prompt_tokens))  # fmt: skip

    def first_token(self, ident: int, at: float) -> None:
        """Request `ident`'s first token came at `at`: it is running, its end dates from `at`."""
        entry = self._entries.get(ident)
        if entry is not None:
            entry.first_at = at
            entry.observed = True

    def prefill_after(self, at: float) -> int:
        """Uncached tokens of the requests whose first token has not come and is predicted after
        `at`: the prefill still ahead of a request admitted at `at` (FCFS: they were sent before)."""
        return sum(e.uncached_tokens for e in self._entries.values() if not e.observed and e.first_at > at)

    def remove(self, ident: int) -> None:
        """Request `ident` ended (whatever the outcome): its blocks are free. Unknown idents: no-op."""
        entry = self._entries.pop(ident, None)
        if entry is None or entry.group is None:
            return
        keys, members = self._groups[entry.group]
        if members <= 1:
            del self._groups[entry.group]
        else:
            self._groups[entry.group] = (keys, members - 1)

    def held(self, now: float, tpot_s: float, block_size: int) -> list[Held]:
        """Each request's claim at `now`: blocks for its prompt and the tokens generated by now, freed
        at its first token + output tokens x `tpot_s` (not before `now` for one still held). Drops
        entries lost long ago (`LOST_AFTER_S`)."""
        out: list[Held] = []
        lost: list[int] = []
        for ident, e in self._entries.items():
            first = e.first_at if e.observed or e.first_at > now else now
            end = first + e.output_tokens * tpot_s
            if end + LOST_AFTER_S < now:
                lost.append(ident)
                continue
            generated = 0
            if e.observed and now > e.first_at and tpot_s > 0:
                generated = min(int((now - e.first_at) / tpot_s) + 1, e.output_tokens)
            tokens = e.prompt_tokens + generated
            blocks = -(-tokens // block_size)
            out.append(Held(end if end > now else now, blocks, e.group, e.shared_tokens // block_size))
        for ident in lost:
            self.remove(ident)
        return out

    def wait_s(self, now: float, tpot_s: float, block_size: int, capacity_blocks: int,
               prompt_tokens: int, prefix_keys: Sequence[int] = ()) -> float:  # fmt: skip
        """`admission_wait_s` of a new `prompt_tokens` prompt with `prefix_keys` behind this ledger's
        requests, on a replica of `capacity_blocks` blocks of `block_size` tokens."""
        if capacity_blocks <= 0 or block_size < 1 or not self._entries:
            return 0.0
        group = prefix_keys[0] if prefix_keys else None
        shared = min(self.shared_tokens(prefix_keys), prompt_tokens) // block_size
        new = Held(now, -(-prompt_tokens // block_size), group, shared if group is not None else 0)
        return admission_wait_s(now, self.held(now, tpot_s, block_size), new, capacity_blocks)
