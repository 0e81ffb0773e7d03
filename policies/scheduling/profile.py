"""A scheduling profile: filters, then weighted scorers, then a picker — one decision per request."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from policies.scheduling.context import SchedulingContext
from policies.scheduling.contracts import Filter, Picker, Scorer
from policies.types import ReplicaState


class WeightedScorer(NamedTuple):
    """A scorer and its weight (finite, >= 0; 0 keeps it in the debug scores without effect)."""

    scorer: Scorer
    weight: float


class Decision(NamedTuple):
    """The outcome of one `SchedulingProfile.schedule` call (immutable).

    - `ranked`: every candidate that passed the filters, best first (the forwarder fails over in this
      order); empty when nothing can serve.
    - `plugin_seconds`: plugin name -> seconds spent in it, only when a timer was given.
    - `dropped` (property): replica -> name of the filter that dropped it.
    - `scores` and `total` (properties, built on first use so the request path does not pay for them):
      replica -> scorer name -> clamped score in [0, 1] (for the winner; for every ranked replica when
      `explain=True`), and replica -> weighted sum (for every ranked replica).

    A NamedTuple rather than a frozen dataclass: it is built once per request, and a frozen
    dataclass's `__init__` costs about 2 µs more.
    """

    ranked: tuple[ReplicaState, ...]
    plugin_seconds: Mapping[str, float]
    # (filter name, candidates before it, candidates it kept) for each filter that dropped some.
    filter_steps: tuple[tuple[str, Sequence[ReplicaState], Sequence[ReplicaState]], ...]
    scored: tuple[ReplicaState, ...] = ()  # the candidates the scorers saw, in their order
    totals: tuple[float, ...] = ()  # aligned with `scored`
    columns: tuple[tuple[str, Sequence[float]], ...] = ()  # (scorer name, raw scores aligned with `scored`)
    explain: bool = False

    @property
    def replica(self) -> ReplicaState | None:
        """The winner, or None when nothing can serve."""
        return self.ranked[0] if self.ranked else None

    @property
    def dropped(self) -> Mapping[str, str]:
        out: dict[str, str] = {}
        for name, before, kept in self.filter_steps:
            survivors = {r.name for r in kept}
            for r in before:
                if r.name not in survivors:
                    out[r.name] = name
        return out

    @property
    def total(self) -> Mapping[str, float]:
        return {r.name: t for r, t in zip(self.scored, self.totals, strict=True)}

    @property
    def scores(self) -> Mapping[str, Mapping[str, float]]:
        if not self.ranked:
            return {}
        shown = self.ranked if self.explain else self.ranked[:1]
        index = {r.name: i for i, r in enumerate(self.scored)}
        return {
            r.name: {name: _clamp(column[index[r.name]]) for name, column in self.columns} for r in shown
        }


class SchedulingProfile:
    """Filters -> weighted scorers -> picker, as the llm-d scheduler wires its plugins.

    Stateless and immutable after construction; safe to share. Plugin names must be unique within the
    profile (they key timings, scores and drop reasons). `schedule` is pure given `rng`.
    """

    __slots__ = ("_filters", "_picker", "_scorers")

    def __init__(
        self, filters: Sequence[Filter], weighted_scorers: Sequence[WeightedScorer], picker: Picker
    ) -> None:
        names = [f.name for f in filters] + [w.scorer.name for w in weighted_scorers] + [picker.name]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate plugin names in a profile: {', '.join(duplicates)}")
        for w in weighted_scorers:
            if not (math.isfinite(w.weight) and w.weight >= 0):
                raise ValueError(f"scorer {w.scorer.name!r}: weight must be finite and >= 0, got {w.weight}")
        self._filters = tuple(filters)
        self._scorers = tuple(WeightedScorer(w.scorer, float(w.weight)) for w in weighted_scorers)
        self._picker = picker

    @property
    def filters(self) -> tuple[Filter, ...]:
        return self._filters

    @property
    def weighted_scorers(self) -> tuple[WeightedScorer, ...]:
        return self._scorers

    @property
    def picker(self) -> Picker:
        return self._picker

    def schedule(
        self,
        ctx: SchedulingContext,
        candidates: Sequence[ReplicaState],
        rng: random.Random,
        timer: Callable[[], float] | None = None,
        explain: bool = False,
    ) -> Decision:
        """Rank `candidates` for `ctx.request`.

        A filter that drops every remaining candidate ends the decision with nothing to serve, unless
        it is soft, in which case it is skipped. Each score is clamped to [0, 1] (NaN -> 0) and the
        total is sum(weight x score). `timer` (e.g. `time.perf_counter`) turns on per-plugin timing.
        """
        seconds: dict[str, float] = {}
        steps: list[tuple[str, Sequence[ReplicaState], Sequence[ReplicaState]]] = []
        current: Sequence[ReplicaState] = candidates
        for f in self._filters:
            if timer is None:
                kept = f.filter(ctx, current)
            else:
                started = timer()
                kept = f.filter(ctx, current)
                seconds[f.name] = timer() - started
            if len(kept) == len(current):
                continue
            if not kept and f.soft:
                continue
            steps.append((f.name, current, kept))  # turned into `dropped` only if someone asks
            current = kept
            if not current:
                return Decision((), seconds, tuple(steps))

        count = len(current)
        columns: list[tuple[str, Sequence[float]]] = []
        totals: list[float] | None = None
        offset = 0.0
        for scorer, weight in self._scorers:
            if timer is None:
                raw = scorer.score(ctx, current)
            else:
                started = timer()
                raw = scorer.score(ctx, current)
                seconds[scorer.name] = timer() - started
            if len(raw) != count:
                raise ValueError(f"scorer {scorer.name!r} returned {len(raw)} scores for {count} candidates")
            columns.append((scorer.name, raw))
            if not count:
                continue
            first = raw[0]
            if raw.count(first) == count:
                # The same score for everyone (no adapter, no session, a cold prompt): it cannot
                # change the order, so add it once instead of a pass over the candidates.
                offset += weight * (0.0 if not first > 0.0 else 1.0 if first > 1.0 else first)
                continue
            # Clamp to [0, 1] and weight; `not v > 0.0` sends negatives and NaN to 0 in one comparison.
            # Plain comprehensions: on CPython 3.11 they beat map/operator and C-level range checks
            # at these sizes (measured with loadtests.decision_bench).
            if totals is None:
                totals = [weight * (0.0 if not v > 0.0 else 1.0 if v > 1.0 else v) for v in raw]
            else:
                totals = [
                    t + weight * (0.0 if not v > 0.0 else 1.0 if v > 1.0 else v)
                    for t, v in zip(totals, raw)  # noqa: B905 - lengths checked above
                ]
        if totals is None:
            totals = [offset] * count
        elif offset:
            totals = [t + offset for t in totals]

        if timer is None:
            ranked = self._picker.pick(ctx, current, totals, rng)
        else:
            started = timer()
            ranked = self._picker.pick(ctx, current, totals, rng)
            seconds[self._picker.name] = timer() - started
        return Decision(
            tuple(ranked), seconds, tuple(steps), tuple(current), tuple(totals), tuple(columns), explain
        )


def _clamp(value: float) -> float:
    return 0.0 if not value > 0.0 else 1.0 if value > 1.0 else value
