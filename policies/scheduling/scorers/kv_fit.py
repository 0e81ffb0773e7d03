"""`kv-fit`: a prefix group goes where its blocks fit, and leaves a home that cannot hold it (issue #11).

Reads `ctx.kv_fit` (`policies.kv_fit.GroupFit`, built by the gateway from its group ledger). Neutral
(1.0 for everyone) when there is no view, or when some candidate is believed to hold the prompt's
leading blocks, its group's home still fits it and no longer holds the most of it (a group spilled
over several replicas under load: prefix affinity and load decide, as without this scorer). When the
home fits it and holds the most of it, the home scores 1.0 and the others `other`: a partial match
(a prefix whose tail the index let go) is not lost to a replica with one request less in flight.
Otherwise the group is being placed (new, or its home's picture lost it) or must move (its home
holds more groups placed before it than `usable` x its capacity), and each candidate scores:

- 1.0: the group fits there (what its groups claim + the group <= `usable` x capacity; on the home,
  only the groups placed before it count), and it is the home or the home does not fit;
- `other`: it fits there, but the home fits too (a group stays put unless it must move);
- below 0.5: it does not fit; 0.5 x capacity / demand, so the least over-committed replica leads
  when nothing fits (a working set beyond the fleet's KV still spreads instead of piling);
- 1.0 for a replica of unknown capacity (not scraped yet): no reason to avoid it.

A placed group that fits nowhere stays on its home (its home scores 1.0, or neutral when a candidate
holds it): moving it would only evict it elsewhere and start the same over there.

With weight 5 next to prefix 3 and queue 2 (the `kv-fit` profile), a fitting replica beats a
non-fitting one whatever the queue scores, and a group that must move leaves a home that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class KvFitScorer:
    """See the module docstring. `usable` in (0, 1]: the share of a replica's KV that reused prefixes
    may claim (the rest is for running requests and unique suffixes); `other` in [0.5, 1]: a fitting
    replica's score while the group's home fits too."""

    name: str = "kv-fit"
    usable: float = 0.8
    other: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.usable <= 1.0:
            raise ValueError(f"usable must be in (0, 1], got {self.usable}")
        if not 0.5 <= self.other <= 1.0:
            raise ValueError(f"other must be in [0.5, 1], got {self.other}")

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        view = ctx.kv_fit
        count = len(candidates)
        if view is None or view.blocks <= 0:
            return [1.0] * count
        usable = self.usable
        blocks = view.blocks
        home = view.home
        capacity = view.capacity
        home_cap = capacity.get(home) if home is not None else None
        home_fits = home_cap is not None and view.ahead + blocks <= usable * home_cap
        match = ctx.prefix_match
        held = bool(match) and any(match.get(r.name) for r in candidates)
        if held and (home_fits or home is None or home_cap is None):
            on_home = match.get(home, 0) if home is not None else 0
            if not home_fits or not on_home or on_home < max(match.get(r.name, 0) for r in candidates):
                return [1.0] * count
            # Its home fits it and holds the most of it: keep it there, even when a replica with a
            # request less in flight outweighs a partial prefix match by queue depth alone.
            return [1.0 if r.name == home else self.other for r in candidates]
        claimed = view.claimed
        out = []
        for r in candidates:
            cap = capacity.get(r.name)
            if cap is None:
                out.append(1.0)
                continue
            demand = (view.ahead if r.name == home else claimed.get(r.name, 0.0)) + blocks
            room = usable * cap
            if demand <= room:
                out.append(1.0 if r.name == home or not home_fits else self.other)
            else:
                out.append(0.5 * room / demand)
        if home_cap is not None and not any(v >= 0.5 for v in out):
            if held:
                return [1.0] * count  # it must move but fits nowhere: moving would only evict it elsewhere
            return [1.0 if r.name == home else v for r, v in zip(candidates, out, strict=True)]
        return out
