"""Prefix groups and where they live: the claims behind placement that respects KV capacity (issue #11).

The approximate prefix index (`policies.prefix_index`) is an LRU per replica sized from the replica's
real KV, so after warm-up it is always "full" (of unique suffixes as much as of shared prefixes) and
says nothing about whether a NEW prefix would fit next to the ones a replica is already home to. This
ledger counts what matters instead: prefix GROUPS (prompts whose first `group_blocks` index blocks are
the same), the replica each one was placed on (its home), and how many leading blocks its requests
reuse (its size). A group claims its size on its home while it is active; a group that goes quiet
stops claiming (`quiet_s`), and one seen only once claims its prompt's blocks for `provisional_s`
only (most prompts are never reused; the few that are become confirmed on their first reuse).

Belief against reality. The ledger also counts, per replica, the prefix tokens kvgate believed the
replica would hit (the index's match on it at dispatch) and compares that rate with the replica's own
prefix-cache counters from the scrape (`vllm:prefix_cache_hits` / `_queries`). A replica that hits
much less than believed is evicting what kvgate thinks it holds: its `reality` factor (an EWMA of
real rate / believed rate), relative to the best candidate's and clamped to [`min_reality`, 1],
scales the capacity the scorer counts on.

`fit_view` gives the `kv-fit` scorer (`policies.scheduling.scorers.kv_fit`) one request's frozen view:
the group, its size, its home, what the groups placed on the home before it claim (`ahead`), and what
every candidate's groups claim. The scorer decides; the ledger only remembers.

Pure: no I/O, no clock (every call takes `now`, the caller's monotonic seconds). Bounded: at most
`max_groups` groups (the least recently seen are forgotten first). One owner, one thread.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

_EMPTY: Mapping[str, float] = MappingProxyType({})
_EMPTY_COUNTS: Mapping[str, int] = MappingProxyType({})
_KEPT_KEYS = 128  # leading keys kept of an unconfirmed group's first prompt (8 bytes each)


@dataclass(frozen=True, slots=True)
class GroupFit:
    """What the `kv-fit` scorer knows of one request's prefix group; sizes in index blocks.

    - `blocks`: the group's size (the leading blocks its requests reuse; a new group: its prompt's).
    - `home`: the replica the group was placed on, None for a group kvgate has not placed.
    - `ahead`: blocks claimed on `home` by groups placed there before this one (its own excluded).
    - `claimed`: replica -> blocks its active groups claim (this group's own claim excluded).
    - `room`: replica -> the blocks its groups may claim: `usable` x its KV in index blocks x its
      relative `reality` factor (a replica missing from it has an unknown capacity).
    - `homed`: replica -> how many active groups it is home to (this group excluded).
    """

    group: int
    blocks: float
    home: str | None = None
    ahead: float = 0.0
    claimed: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    room: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    homed: Mapping[str, int] = field(default_factory=lambda: _EMPTY_COUNTS)

    def fits(self, replica: str) -> bool | None:
        """Whether the group fits on `replica` next to the groups it claims for (on its home: the
        groups placed before it); None when the replica's capacity is unknown."""
        room = self.room.get(replica)
        if room is None:
            return None
        held = self.ahead if replica == self.home else self.claimed.get(replica, 0.0)
        return held + self.blocks <= room

    def demand(self, replica: str) -> float:
        """What the replica's groups would claim with this one (on its home: those placed before it)."""
        return (self.ahead if replica == self.home else self.claimed.get(replica, 0.0)) + self.blocks


def group_key(prefix_keys: Sequence[int], group_blocks: int) -> int | None:
    """The key naming a prompt's group: its chained key at block min(len, group_blocks); None if empty."""
    if not prefix_keys:
        return None
    return prefix_keys[min(len(prefix_keys), group_blocks) - 1]


class _Group:
    """`first`: the leading keys (at most `_KEPT_KEYS`) of an unconfirmed group's first prompt, to
    measure what its next prompt shares with it; dropped once the group is confirmed."""

    __slots__ = ("blocks", "confirmed", "first", "home", "seen")

    def __init__(self, home: str, keys: Sequence[int], seen: float) -> None:
        self.home = home
        self.blocks = float(len(keys))
        self.seen = seen
        self.confirmed = False
        self.first: array[int] | None = array("Q", keys[:_KEPT_KEYS])


def _shared(first: array[int], keys: Sequence[int]) -> int:
    """Leading keys `keys` shares with `first` (chained keys: equal at i means equal up to i)."""
    lo, hi = 0, min(len(first), len(keys))  # bisect for the first differing position
    while lo < hi:
        mid = (lo + hi) // 2
        if first[mid] == keys[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _Reality:
    """Believed and real prefix hits of one replica since its last judgement."""

    __slots__ = ("believed_hits", "believed_queries", "factor", "last_hits", "last_queries", "real_hits",
                 "real_queries")  # fmt: skip

    def __init__(self) -> None:
        self.believed_hits = self.believed_queries = 0.0
        self.real_hits = self.real_queries = 0
        self.last_hits: int | None = None
        self.last_queries: int | None = None
        self.factor = 1.0


class GroupLedger:
    """Prefix groups, their homes and sizes, and each replica's belief-vs-reality factor.

    `record` after each dispatch, `observe_counters` after each scrape, `fit_view` before a decision.
    """

    def __init__(
        self,
        *,
        group_blocks: int = 2,
        quiet_s: float = 60.0,
        provisional_s: float = 5.0,
        max_groups: int = 50_000,
        min_window_blocks: float = 64.0,
        min_reality: float = 0.5,
        usable: float = 0.8,
    ) -> None:
        if group_blocks < 1 or max_groups < 1:
            raise ValueError("group_blocks and max_groups must be >= 1")
        if not 0 < usable <= 1:
            raise ValueError(f"usable must be in (0, 1], got {usable}")
        if not (quiet_s > 0 and provisional_s > 0 and min_window_blocks > 0 and 0 < min_reality <= 1):
            raise ValueError("quiet_s, provisional_s, min_window_blocks must be > 0, min_reality in (0, 1]")
        self.group_blocks = group_blocks
        self.usable = usable
        self._quiet_s = quiet_s
        self._provisional_s = provisional_s
        self._max_groups = max_groups
        self._min_window = min_window_blocks
        self._min_reality = min_reality
        # Least recently seen first, one dict per lifetime so each expires from its front.
        self._provisional: OrderedDict[int, _Group] = OrderedDict()
        self._confirmed: OrderedDict[int, _Group] = OrderedDict()
        self._homes: dict[str, dict[int, None]] = {}  # replica -> its groups, in placement order
        self._claimed: dict[str, float] = {}
        self._ahead: dict[str, dict[int, float]] = {}  # replica -> group -> blocks ahead (cache)
        self._reality: dict[str, _Reality] = {}
        self._room: dict[str, float] = {}  # replica -> its room at the last fit_view naming it

    # -- reading -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._provisional) + len(self._confirmed)

    def home_of(self, group: int | None) -> str | None:
        """The group's home replica; None for a group the ledger does not know (or None)."""
        if group is None:
            return None
        g = self._confirmed.get(group) or self._provisional.get(group)
        return None if g is None else g.home

    def groups_on(self, replica: str) -> int:
        return len(self._homes.get(replica, ()))

    def claimed(self, replica: str) -> float:
        return self._claimed.get(replica, 0.0)

    def reality(self, replica: str) -> float:
        r = self._reality.get(replica)
        return 1.0 if r is None else r.factor

    def fit_view(
        self, prefix_keys: Sequence[int], capacity_blocks: Mapping[str, float], now: float
    ) -> GroupFit | None:
        """The scorer's view for a prompt with these index keys; None when it has none.

        `capacity_blocks`: candidate -> its KV in index blocks (0 while unknown)."""
        key = group_key(prefix_keys, self.group_blocks)
        if key is None:
            return None
        self.expire(now)
        names = tuple(capacity_blocks)
        claimed = self._claimed
        room = self._effective(capacity_blocks)
        self._room.update(room)
        g = self._confirmed.get(key) or self._provisional.get(key)
        homes = self._homes
        homed = {n: len(homes.get(n, ())) for n in names}
        if g is None:
            return GroupFit(key, float(len(prefix_keys)), None, 0.0,
                            {n: claimed.get(n, 0.0) for n in names}, room, homed)  # fmt: skip
        others = {n: claimed.get(n, 0.0) for n in names}
        if g.home in others:
            others[g.home] -= g.blocks
            homed[g.home] -= 1
        return GroupFit(key, g.blocks, g.home, self._ahead_of(g.home, key), others, room, homed)

    # -- writing -----------------------------------------------------------------------------------

    def record(
        self, prefix_keys: Sequence[int], replica: str, held_blocks: int, now: float, held_on_home: int = 0
    ) -> None:
        """A prompt with these keys went to `replica`, which was believed to hold `held_blocks` of them
        (and its group's home `held_on_home`, when the home is another replica).

        A new group is placed there (its home), claiming its prompt's blocks provisionally. Its next
        prompt confirms it, its size what the two prompts share; later prompts on its home may grow
        it (what the index held there). Sent to another replica, it moves there when neither that
        replica nor its home held any of it and the new replica has room for it (a placement: its
        home's picture lost it), or when its home no longer has room for it and the new replica has
        (a move); otherwise it was a spill under load and keeps its home. A placement ignored room
        once: a request the `latency-knee` filter sent off its group's home re-homed the group on
        whichever replica was within the knee, and the `kv-fit` runs with the gate on put 10 groups
        on a replica that fits 8 (docs/benchmarks.md, "A decode step in the knee").
        """
        key = group_key(prefix_keys, self.group_blocks)
        if key is None:
            return
        self._believe(replica, held_blocks, len(prefix_keys))
        g = self._confirmed.get(key)
        if g is None:
            g = self._provisional.get(key)
        if g is None:
            g = _Group(replica, prefix_keys, now)
            self._provisional[key] = g
            self._claim(replica, key, g.blocks)
            self._bound()
            return
        g.seen = now
        if not g.confirmed and g.first is not None:
            # Its first reuse: the first prompt's size was a guess; what the two share is the group.
            # Measured on the keys, not on the index, whose LRU may have let the prefix's tail go.
            del self._provisional[key]
            g.confirmed = True
            self._confirmed[key] = g
            shared = _shared(g.first, prefix_keys)
            g.first = None
            self._resize(g, float(max(shared, held_blocks if replica == g.home else 0)))
        elif replica == g.home and held_blocks > g.blocks:
            self._resize(g, float(held_blocks))  # it grew (a conversation), as far as the index saw
        if replica != g.home:
            placed = held_blocks == 0 and held_on_home == 0 and self._has_room(replica, g.blocks)
            if placed or self._must_move(g, key, replica):
                self._unclaim(g.home, key, g.blocks)
                g.home = replica
                self._claim(replica, key, g.blocks)
        (self._confirmed if g.confirmed else self._provisional).move_to_end(key)

    def observe_counters(self, replica: str, hits_tokens: int, queries_tokens: int) -> None:
        """A scrape's cumulative prefix-cache counters (tokens). When enough was dispatched since the
        last judgement (`min_window_blocks` prompt blocks), the real hit rate (hits / queries, tokens)
        against the believed one (held / prompt blocks at dispatch) updates the replica's factor."""
        r = self._reality.setdefault(replica, _Reality())
        if r.last_hits is not None and r.last_queries is not None:
            dh, dq = hits_tokens - r.last_hits, queries_tokens - r.last_queries
            if dh >= 0 and dq >= 0:
                r.real_hits += dh
                r.real_queries += dq
        r.last_hits, r.last_queries = hits_tokens, queries_tokens
        if r.believed_queries < self._min_window or r.real_queries <= 0:
            return
        believed = r.believed_hits / r.believed_queries
        if believed > 0.05:
            real = r.real_hits / r.real_queries
            r.factor = 0.5 * r.factor + 0.5 * (real / believed)
        r.believed_hits = r.believed_queries = 0.0
        r.real_hits = r.real_queries = 0

    def forget_replica(self, replica: str) -> None:
        """The replica left or restarted: its groups lose their home and its counters start over."""
        for key in list(self._homes.get(replica, ())):
            self._confirmed.pop(key, None)
            self._provisional.pop(key, None)
        self._homes.pop(replica, None)
        self._claimed.pop(replica, None)
        self._ahead.pop(replica, None)
        self._reality.pop(replica, None)
        self._room.pop(replica, None)

    def expire(self, now: float) -> None:
        """Forget groups quiet for longer than their lifetime."""
        for groups, life in ((self._provisional, self._provisional_s), (self._confirmed, self._quiet_s)):
            while groups:
                key, g = next(iter(groups.items()))
                if now - g.seen <= life:
                    break
                del groups[key]
                self._unclaim(g.home, key, g.blocks)

    # -- internals ---------------------------------------------------------------------------------

    def _effective(self, capacity_blocks: Mapping[str, float]) -> dict[str, float]:
        """Each known capacity times `usable` and the replica's reality factor RELATIVE to the best
        candidate's:
        what the index misses through its own approximations (byte-estimated tokens, index blocks
        coarser than the engine's) is common to every replica and cancels; a replica evicting what
        its peers keep stands out."""
        reality = self._reality
        factors = {n: reality[n].factor if n in reality else 1.0 for n in capacity_blocks}
        best = max(factors.values(), default=1.0)
        floor = self._min_reality
        usable = self.usable
        return {
            n: usable * c * max(floor, min(1.0, factors[n] / best))
            for n, c in capacity_blocks.items()
            if c > 0
        }

    def _must_move(self, g: _Group, key: int, replica: str) -> bool:
        """The group's home has no room left for it (counting the groups placed there before it) and
        `replica` has."""
        home_room = self._room.get(g.home)
        room = self._room.get(replica)
        if home_room is None or room is None:
            return False
        return self._ahead_of(g.home, key) + g.blocks > home_room and self._has_room(replica, g.blocks)

    def _has_room(self, replica: str, blocks: float) -> bool:
        """`replica`'s groups and `blocks` more fit in its room (True while its room is unknown)."""
        room = self._room.get(replica)
        return room is None or self._claimed.get(replica, 0.0) + blocks <= room

    def _believe(self, replica: str, held: int, blocks: int) -> None:
        r = self._reality.setdefault(replica, _Reality())
        r.believed_hits += held
        r.believed_queries += blocks

    def _bound(self) -> None:
        while len(self) > self._max_groups:
            groups = self._provisional or self._confirmed
            key, g = groups.popitem(last=False)
            self._unclaim(g.home, key, g.blocks)

    def _claim(self, replica: str, key: int, blocks: float) -> None:
        self._homes.setdefault(replica, {})[key] = None
        self._claimed[replica] = self._claimed.get(replica, 0.0) + blocks
        self._ahead.pop(replica, None)

    def _unclaim(self, replica: str, key: int, blocks: float) -> None:
        homes = self._homes.get(replica)
        if homes is not None and homes.pop(key, 0) is None:
            left = self._claimed.get(replica, 0.0) - blocks
            self._claimed[replica] = left if homes else 0.0
            self._ahead.pop(replica, None)

    def _resize(self, g: _Group, blocks: float) -> None:
        self._claimed[g.home] = self._claimed.get(g.home, 0.0) + blocks - g.blocks
        g.blocks = blocks
        self._ahead.pop(g.home, None)

    def _ahead_of(self, replica: str, key: int) -> float:
        cache = self._ahead.get(replica)
        if cache is None:
            cache = {}
            total = 0.0
            for k in self._homes.get(replica, ()):
                cache[k] = total
                g = self._confirmed.get(k) or self._provisional.get(k)
                total += g.blocks if g is not None else 0.0
            self._ahead[replica] = cache
        return cache.get(key, 0.0)
