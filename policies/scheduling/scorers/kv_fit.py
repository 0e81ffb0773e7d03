"""`kv-fit`: a prefix group goes where its blocks fit, and leaves a home that cannot hold it (issue #11).

Reads `ctx.kv_fit` (`policies.kv_fit.GroupFit`, built by the gateway from its group ledger, which
also decides what "fits" means: the group's blocks next to those its replica's groups claim, within
`usable` of the replica's KV scaled by how well the replica's real hits match kvgate's belief).

- No view: neutral (1.0 for everyone).
- Some candidate is believed to hold the prompt's leading blocks and the group's home fits it:
  neutral, except that a home holding more of it than any other candidate scores 1.0 and the
  others `other` (a partial match, a prefix whose tail the index let go, is not lost to a replica
  with one request less in flight). A group spilled over several replicas under load stays with
  prefix affinity and load.
- Otherwise the group is being placed (new, or its home's picture lost it) or must move (its home
  no longer has room for it after the groups placed there before it). If it fits somewhere: 0
  where it does not, 1.0 for a replica of unknown capacity (not scraped yet), and where it fits:
  for a new group 0.5-1.0 by what the replica's groups claim and how many they are, least first
  (min-max of each, the larger penalty counts: one group more weighs the whole 0.5, so groups
  spread evenly: 4/4 rather than 5/3 hit 94-95% of the oracle against 88-91% in
  docs/benchmarks.md); for a placed group 1.0 (`other` for a non-home replica
  while the home fits too: a group stays put unless it must move).
- It fits nowhere: a held group that must move stays (neutral: moving would only evict it
  elsewhere), a placed group goes back to its home (1.0 there, 0 elsewhere), and a new group goes
  where it over-commits least (room / demand, min-max scaled to [0, 0.5]: one group more weighs
  the whole 0.5), so a working set beyond the fleet's KV still spreads instead of piling.

With weight 5 next to prefix 3 and queue 2 (the `kv-fit` profile), a fitting replica beats a
non-fitting one whatever the prefix and queue scores, so a group that must move leaves a home that
still holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.kv_fit import GroupFit
from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class KvFitScorer:
    """See the module docstring. `other` in [0, 1]: a fitting replica's score while the group's home
    fits too (how much staying put is worth against the queue)."""

    name: str = "kv-fit"
    other: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.other <= 1.0:
            raise ValueError(f"other must be in [0, 1], got {self.other}")

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        view = ctx.kv_fit
        count = len(candidates)
        if view is None or view.blocks <= 0:
            return [1.0] * count
        home = view.home
        home_fits = view.fits(home) if home is not None else None
        match = ctx.prefix_match
        held = bool(match) and any(match.get(r.name) for r in candidates)
        if held and home_fits is not False:
            on_home = match.get(home, 0) if home is not None else 0
            if (
                not home_fits
                or not on_home
                or any(match.get(r.name, 0) >= on_home for r in candidates if r.name != home)
            ):
                return [1.0] * count
            # Its home fits it and holds the most of it: keep it there, even when a replica with a
            # request less in flight outweighs a partial prefix match by queue depth alone.
            return [1.0 if r.name == home else self.other for r in candidates]
        fits = [view.fits(r.name) for r in candidates]
        if any(fits) and home is None:
            # A new group: among the replicas it fits, the one whose groups claim least and are
            # fewest leads by 0.5 (min-max of each: one group's difference weighs it all), so the
            # groups spread evenly.
            return self._spread(view, candidates, fits)
        if any(fits):
            other = self.other if home_fits else 1.0
            return [
                1.0 if f is None or (f and r.name == home) else other if f else 0.0
                for r, f in zip(candidates, fits, strict=True)
            ]
        # It fits nowhere known.
        if held:
            return [1.0] * count  # it must move but fits nowhere: moving would only evict it elsewhere
        if home_fits is not None:
            return [1.0 if r.name == home else 0.0 for r in candidates]  # it stays on its home
        # A new group that fits nowhere: the least over-committed replica leads by the whole 0.5.
        room = view.room
        ratios = [room.get(r.name, 0.0) / view.demand(r.name) for r in candidates]
        low, high = min(ratios), max(ratios)
        if high == low:
            return [0.5] * count
        return [0.5 * (v - low) / (high - low) for v in ratios]

    @staticmethod
    def _spread(
        view: GroupFit, candidates: Sequence[ReplicaState], fits: Sequence[bool | None]
    ) -> list[float]:
        """A new group that fits somewhere: 0 where it does not, 1.0 for a replica of unknown
        capacity, and where it fits 1.0 - 0.5 x the larger of two min-max penalties among those
        replicas: blocks claimed and groups homed. Claims alone were not enough: a group seen once
        claims its whole prompt (its unique suffix too), so 3 groups seen once could out-claim 4
        confirmed ones and the queue put a 5th group next to them (5/4/4/3 at half the KV)."""
        claimed, homed = view.claimed, view.homed
        blocks = [claimed.get(r.name, 0.0) for r, f in zip(candidates, fits, strict=True) if f]
        groups = [homed.get(r.name, 0) for r, f in zip(candidates, fits, strict=True) if f]
        low_b, span_b = min(blocks), max(blocks) - min(blocks)
        low_g, span_g = min(groups), max(groups) - min(groups)
        out = []
        for r, f in zip(candidates, fits, strict=True):
            if not f:
                out.append(1.0 if f is None else 0.0)
                continue
            pb = (claimed.get(r.name, 0.0) - low_b) / span_b if span_b else 0.0
            pg = (homed.get(r.name, 0) - low_g) / span_g if span_g else 0.0
            out.append(1.0 - 0.5 * max(pb, pg))
        return out
