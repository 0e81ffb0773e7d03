"""`near-best`: any candidate within a small margin of the best total may win; a clearly better one wins.

Why. Several gateway processes in front of one fleet each see the same scraped numbers and only their
own dispatches. With `max-score`, every process that sees the same picture sends its next requests to
the same best-scoring replica until its OWN in-flight count there tips the scores, so N processes put
N times the intended load on it between two scrapes (herding), and each places a new prefix on a
replica of its own (N cache copies where one would do). Drawing the winner among the near-best
spreads the first and, with the prefix draw below, avoids the second.

How. Candidates whose total is at least `best - margin` form the near-best group (with `margin=0`
this is exactly `max-score`'s tie group and order). The group's winner is drawn:

- when the prompt is new to the group (`hash_blocks > 0`, the request has prefix keys, and this
  gateway believes no near-best candidate holds any of its blocks): by rendezvous hashing (highest
  `xxh3_64(replica name, seed = the prompt's key at block min(blocks, hash_blocks))` wins). The
  draw depends only on the prompt's first `hash_blocks` index blocks and the replica's name, so
  every gateway process, with no shared state, places a given prefix on the same replica whenever
  it is near-best there (and, when that replica is filtered out, on the same second one), while
  different prefixes land on different replicas;
- otherwise uniformly with one `rng.random()`: among replicas that already hold the prefix, the
  draw spreads its requests as `max-score`'s random tie-break did (hashing there too sent every
  near-tie of a group to one replica: TTFT p90 up to 1.2x on one gateway at 8 replicas).

The rest of the group follows the winner in cyclic order, then everyone else by descending total (the
forwarder's failover order). A candidate ahead by more than `margin` (a held prefix: 3 x the matched
share in the default profile) always wins, so affinity is untouched; the margin only decides among
replicas the scorers could not tell apart by more than that. Pure: the result is a function of the
inputs and `rng`'s state.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState

_hash = xxhash.xxh3_64_intdigest


@dataclass(frozen=True, slots=True)
class NearBestPicker:
    """Winner drawn among candidates within `margin` (>= 0, in weighted-total units) of the best; see
    the module docstring. `hash_blocks` (>= 0): how many leading prefix blocks key the rendezvous
    draw (0: always the rng)."""

    name: str = "near-best"
    margin: float = 0.5
    hash_blocks: int = 4

    def __post_init__(self) -> None:
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"margin must be finite and >= 0, got {self.margin}")
        if self.hash_blocks < 0:
            raise ValueError(f"hash_blocks must be >= 0, got {self.hash_blocks}")

    def pick(
        self,
        ctx: SchedulingContext,
        candidates: Sequence[ReplicaState],
        totals: Sequence[float],
        rng: random.Random,
    ) -> list[ReplicaState]:
        count = len(candidates)
        if count < 2:
            return list(candidates)
        order = sorted(range(count), key=totals.__getitem__, reverse=True)
        floor = totals[order[0]] - self.margin
        near = 1
        while near < count and totals[order[near]] >= floor:
            near += 1
        # Comprehensions throughout: a tuple's __getitem__ through map is a slot-wrapper call (~600
        # instructions per candidate) and a key lambda a frame per candidate; subscripts are specialised.
        ranked = [candidates[i] for i in order]
        if near > 1:
            keys = ctx.request.prefix_keys
            group = ranked[:near]
            if self.hash_blocks and keys and not any([ctx.prefix_match.get(r.name) for r in group]):
                seed = keys[min(len(keys), self.hash_blocks) - 1]
                draws = [_hash(r.name.encode(), seed) for r in group]
                start = draws.index(max(draws))  # the first of equal draws, as max(key=...) took
            else:
                start = int(rng.random() * near)
            ranked[:near] = group[start:] + group[:start]
        return ranked
