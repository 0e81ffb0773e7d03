"""`near-best`'s tuned pick gives exactly the order of a plain reference, rng draws included.

The reference follows the module docstring one step at a time (a stable sort by total, the near-best
group, the rendezvous or rng draw, the rotation); on random totals (ties included), prefix keys and
matches, with equally seeded rngs, the two orders must be equal and the rngs left in the same state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.scheduling.context import SchedulingContext
from policies.scheduling.pickers.near_best import NearBestPicker
from policies.types import ReplicaState, RequestInfo
from tests.policies.scheduling.builders import replica


def reference(
    picker: NearBestPicker,
    ctx: SchedulingContext,
    candidates: Sequence[ReplicaState],
    totals: Sequence[float],
    rng: random.Random,
) -> list[ReplicaState]:
    if len(candidates) < 2:
        return list(candidates)
    ranked = sorted(zip(candidates, totals, strict=True), key=lambda p: p[1], reverse=True)
    best = ranked[0][1]
    group = [p for p in ranked if p[1] >= best - picker.margin]
    rest = ranked[len(group) :]
    keys = ctx.request.prefix_keys
    if len(group) > 1:
        held = any(ctx.prefix_match.get(r.name) for r, _ in group)
        if picker.hash_blocks and keys and not held:
            seed = keys[min(len(keys), picker.hash_blocks) - 1]
            draws = [xxhash.xxh3_64_intdigest(r.name.encode(), seed) for r, _ in group]
            start = draws.index(max(draws))
        else:
            start = int(rng.random() * len(group))
        group = group[start:] + group[:start]
    return [r for r, _ in group + rest]


@settings(max_examples=500, deadline=None)
@given(
    totals=st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.95, 1.0, 1.04, 2.0, 3.0]), max_size=12),
    margin=st.sampled_from([0.0, 0.05, 0.25, 0.5]),
    hash_blocks=st.integers(0, 3),
    keys=st.lists(st.integers(0, 2**64 - 1), max_size=4),
    held=st.sets(st.integers(0, 11), max_size=3),
    seed=st.integers(0, 1000),
)
def test_pick_equals_the_reference(
    totals: list[float], margin: float, hash_blocks: int, keys: list[int], held: set[int], seed: int
) -> None:
    candidates = tuple(replica(f"replica-{i:02d}") for i in range(len(totals)))
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=100, max_tokens=10,
                       prefix_keys=tuple(keys))  # fmt: skip
    ctx = SchedulingContext(request=info, now=0.0, prefix_match={f"replica-{i:02d}": 1 for i in held},
                            prefix_blocks=len(keys))  # fmt: skip
    picker = NearBestPicker(margin=margin, hash_blocks=hash_blocks)
    rng, ref_rng = random.Random(seed), random.Random(seed)
    assert picker.pick(ctx, candidates, totals, rng) == reference(picker, ctx, candidates, totals, ref_rng)
    assert rng.random() == ref_rng.random()
