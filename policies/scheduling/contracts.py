"""The three plugin contracts of a scheduling profile: filters, scorers, pickers.

Plugins are stateless values (frozen dataclasses) built from config by `registry.build_profile`.
Each has a `name`, unique within its profile, used in decisions, timings and debug headers. They are
called on the request path, so they do no I/O, no logging and nothing that could be done once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


class Filter(Protocol):
    """Drops candidates that cannot (or should not) serve the request.

    Returns the kept candidates in their given order; returning the input sequence itself means
    "kept all". A *soft* filter expresses a preference: when it would drop every candidate the
    profile skips it instead. A hard filter that drops every candidate means nothing can serve.
    """

    @property
    def name(self) -> str: ...

    @property
    def soft(self) -> bool: ...

    def filter(
        self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]
    ) -> Sequence[ReplicaState]: ...


class Scorer(Protocol):
    """Rates each candidate; one value per candidate, aligned with `candidates`.

    Values are meant to be in [0, 1], higher is better; the profile clamps them (NaN counts as 0)
    before weighting, so a scorer cannot outweigh its configured weight.
    """

    @property
    def name(self) -> str: ...

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]: ...


class Picker(Protocol):
    """Orders ALL candidates best first, so the forwarder can fail over to the next best.

    `totals[i]` is the weighted score sum of `candidates[i]`. Randomness comes only from `rng`, so a
    seeded `rng` makes the order reproducible.
    """

    @property
    def name(self) -> str: ...

    def pick(
        self,
        ctx: SchedulingContext,
        candidates: Sequence[ReplicaState],
        totals: Sequence[float],
        rng: random.Random,
    ) -> list[ReplicaState]: ...
