"""A weighted split of traffic over targets, sticky by key, that moves as few keys as it must.

Buckets. A key (a session id, a user, an API key) hashes with the route's name to one of `BUCKETS`
fine-grained buckets (`bucket_of`: xxh3-64, the same in every process, unlike Python's `hash()`); a
request without a key draws a bucket at random. A `Split` assigns each bucket to one target (its
`layout`), so a key keeps its target for as long as the layout does, and the weights are realised
to 1 / `BUCKETS` (target i holds `quotas(weights)[i]` buckets, largest remainder).

Moving. A weight change must move only the buckets that must move: the arms that shrink give up
exactly their excess, only to the arms that grow, and an arm whose quota is unchanged keeps every
bucket it had. No layout that is a function of the weights alone can do that for three or more arms
(the buckets of arm i would depend on its quota only, and then the arms of (k, 0, N-k) and
(k, N-k, 0) force arms 2 and 3 onto the same buckets), so `reweighted` works from the layout in force.
Which buckets move is chosen so that a change and its undo bring the keys back: each arm has a home,
the contiguous range it got in the config's own layout (`Split.fresh`), with a core (its
start for the first target, its end for the last, else its middle); a shrinking arm gives up the
buckets farthest from its home first (outside it, then inside from the edge away from the core), and
a growing arm takes the given-up buckets nearest its home first. With two arms the layout is then
always "arm 0 from the start, arm 1 from the end", a function of the weights alone (90/10 -> 80/20
moves buckets 8000-8999 from the first arm to the second; 80/20 -> 90/10 moves them back).

Pure: no I/O, no clock; the random draw is the caller's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

BUCKETS = 10_000
MAX_TARGETS = 255  # a layout stores one byte per bucket

_hash = xxhash.xxh3_64_intdigest


def bucket_of(route_prefix: bytes, key: bytes) -> int:
    """The bucket of `key` in the route whose `route_prefix` is `route_key(name)`."""
    return _hash(route_prefix + key) % BUCKETS


def route_key(route: str) -> bytes:
    """The bytes a route's name contributes to every key's hash (computed once per route)."""
    return route.encode("utf-8") + b"\x00"


def bucket_of_draw(draw: float) -> int:
    """The bucket of a uniform random draw in [0, 1) (a request without a sticky key)."""
    return min(int(draw * BUCKETS), BUCKETS - 1)


def quotas(weights: Sequence[int], buckets: int = BUCKETS) -> tuple[int, ...]:
    """Buckets per target, proportional to `weights` (integers >= 0, positive sum), summing to
    `buckets`: each its floor share, then one more to the largest remainders (lower index first on
    a tie). A zero weight always gets zero."""
    check_weights(weights)
    total = sum(weights)
    floors = [w * buckets // total for w in weights]
    rems = [w * buckets % total for w in weights]
    short = buckets - sum(floors)
    for i in sorted(range(len(weights)), key=lambda i: (-rems[i], i))[:short]:
        floors[i] += 1
    return tuple(floors)


def check_weights(weights: Sequence[int]) -> None:
    """ValueError unless `weights` are 1..MAX_TARGETS integers >= 0 with a positive sum."""
    if not 1 <= len(weights) <= MAX_TARGETS:
        raise ValueError(f"a split needs 1 to {MAX_TARGETS} targets, got {len(weights)}")
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"weights must be integers >= 0, got {w!r}")
    if sum(weights) <= 0:
        raise ValueError("the weights must have a positive sum")


@dataclass(frozen=True, slots=True)
class Split:
    """Targets, their weights, and the layout realising them. Build with `fresh` (the config's split)
    and change with `reweighted`; read with `target(bucket)` on the request path (one index).

    `layout[b]` is the index of bucket b's target; `homes[i]` is target i's range [start, end) in the
    config's layout, kept through every reweighting (it decides which buckets move, see module doc).
    """

    targets: tuple[str, ...]
    weights: tuple[int, ...]
    layout: bytes
    homes: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if len(set(self.targets)) != len(self.targets):
            raise ValueError("a split's targets must be distinct")
        if len(self.weights) != len(self.targets) or len(self.homes) != len(self.targets):
            raise ValueError("targets, weights and homes must have one entry per target")
        check_weights(self.weights)
        if len(self.layout) != BUCKETS or max(self.layout) >= len(self.targets):
            raise ValueError(f"a layout is {BUCKETS} bytes, each the index of a target")

    @classmethod
    def fresh(cls, targets: Sequence[str], weights: Sequence[int]) -> Split:
        """The config's split: target i holds one contiguous range, in the order given."""
        q = quotas(weights)
        layout = bytearray(BUCKETS)
        homes = []
        start = 0
        for i, n in enumerate(q):
            layout[start : start + n] = bytes([i]) * n
            homes.append((start, start + n))
            start += n
        return cls(tuple(targets), tuple(weights), bytes(layout), tuple(homes))

    def with_layout(self, weights: Sequence[int], layout: bytes) -> Split:
        """The same targets and homes with a given layout (one received from another gateway)."""
        split = Split(self.targets, tuple(weights), bytes(layout), self.homes)
        if split.counts() != quotas(weights):
            raise ValueError("the layout does not realise the weights")
        return split

    def target(self, bucket: int) -> str:
        return self.targets[self.layout[bucket]]

    def counts(self) -> tuple[int, ...]:
        """Buckets held by each target."""
        return tuple(self.layout.count(i) for i in range(len(self.targets)))

    def reweighted(self, weights: Sequence[int]) -> Split:
        """This split with new weights (one per target, same order), moving the fewest buckets: exactly
        the sum of the quotas that shrank, each from a shrinking target to a growing one."""
        if len(weights) != len(self.targets):
            raise ValueError(f"expected {len(self.targets)} weights, got {len(weights)}")
        want = quotas(weights)
        have = self.counts()
        layout = bytearray(self.layout)
        given_up: list[int] = []
        for i, (h, w) in enumerate(zip(have, want, strict=True)):
            if h > w:
                mine = [b for b in range(BUCKETS) if layout[b] == i]
                mine.sort(key=functools.partial(self._closeness, i), reverse=True)
                given_up += mine[: h - w]
        for i, (h, w) in enumerate(zip(have, want, strict=True)):
            if h < w:
                given_up.sort(key=functools.partial(self._closeness, i))
                taken, given_up = given_up[: w - h], given_up[w - h :]
                for b in taken:
                    layout[b] = i
        return Split(self.targets, tuple(weights), bytes(layout), self.homes)

    def _closeness(self, i: int, b: int) -> tuple[int, int, int]:
        """How much bucket b belongs to target i, smaller is more: inside its home first, measured
        from the home's core (its start for the first target, its end for the last, else its
        middle), then outside by distance to the home; ties by
        bucket."""
        start, end = self.homes[i]
        if start <= b < end:
            if i == 0:
                return (0, b - start, b)
            if i == len(self.homes) - 1:
                return (0, end - 1 - b, b)
            return (0, abs(2 * b + 1 - start - end), b)
        return (1, start - b if b < start else b - end + 1, b)


def moved(before: Split, after: Split) -> int:
    """Buckets whose target differs between two layouts of the same targets."""
    return sum(1 for x, y in zip(before.layout, after.layout, strict=True) if x != y)
