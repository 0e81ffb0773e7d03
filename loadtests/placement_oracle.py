"""A placement oracle for the KV-capacity benchmark (issue #11): the best static partition, same engine.

Bench-only: it is not a scheduling plugin (nothing in `policies/` or the gateway knows it) and it
routes on something no router knows up front: every request's prefix group and that the groups are
all the same size. It places each group, at its first request, on the replica next in round-robin
order, and sends every later request of the group there, whatever the load: an exact balanced
partition (group counts per replica differ by at most one, which for groups of equal size is also
the assignment that minimises the largest claim on a replica). It runs in the same discrete-event
run as the routed policies (`loadtests.des`, the gateway's own `Router`, the simulator's engine with
its LRU prefix cache), so its hit rate is what perfect placement reaches in this engine, where the
arithmetic oracle (every request after its group's first hits the whole shared prefix) is not
reachable by any router: the engine's LRU also caches each request's unique question and answer.

A request's group is named by its prompt's chained index key at block `group_blocks` (the key the
`kv-fit` ledger groups by); `PartitionScorer.assignment` lets the bench check that it names exactly
the workload's groups.
"""

from __future__ import annotations

from collections.abc import Sequence

from loadtests.des.simulation import Simulation
from policies.kv_fit import group_key
from policies.scheduling.context import SchedulingContext
from policies.scheduling.pickers.max_score import MaxScorePicker
from policies.scheduling.profile import SchedulingProfile, WeightedScorer
from policies.types import ReplicaState

ORACLE_POLICY = "placement-oracle"


class PartitionScorer:
    """1.0 for the replica the request's group is assigned to, 0 elsewhere; a new group is assigned
    to the next replica in the candidates' order (round robin by first appearance). With `weights`
    (one per replica, in the candidates' order) a new group goes to the replica with the fewest
    groups for its weight instead (ties: the first), e.g. (2, 1): 8/4 of 12 groups, interleaved in
    order of appearance. Stateful, unlike the shipped scorers: one per run."""

    name = ORACLE_POLICY

    def __init__(self, group_blocks: int = 2, weights: Sequence[float] = ()) -> None:
        if any(w <= 0 for w in weights):
            raise ValueError(f"weights must be > 0, got {tuple(weights)}")
        self.group_blocks = group_blocks
        self.weights = tuple(weights)
        self.assignment: dict[int, str] = {}
        self._counts: dict[str, int] = {}

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        key = group_key(ctx.request.prefix_keys, self.group_blocks)
        if key is None:
            return [1.0] * len(candidates)
        home = self.assignment.get(key)
        if home is None:
            home = self.assignment[key] = self._place(candidates)
            self._counts[home] = self._counts.get(home, 0) + 1
        return [1.0 if r.name == home else 0.0 for r in candidates]

    def _place(self, candidates: Sequence[ReplicaState]) -> str:
        if not self.weights:
            return candidates[len(self.assignment) % len(candidates)].name
        if len(self.weights) != len(candidates):
            raise ValueError(f"{len(self.weights)} weights for {len(candidates)} replicas")
        counts = self._counts
        best = min(range(len(candidates)),
                   key=lambda i: ((counts.get(candidates[i].name, 0) + 1) / self.weights[i], i))  # fmt: skip
        return candidates[best].name


def install(sim: Simulation, weights: Sequence[float] = ()) -> PartitionScorer:
    """Make every gateway of `sim` route by a fresh static partition (no filters: simulated replicas
    never fail); returns the scorer, to read its assignment after the run. `weights`: see
    `PartitionScorer` (default: round robin)."""
    scorer = PartitionScorer(weights=weights)
    profile = SchedulingProfile((), (WeightedScorer(scorer, 1.0),), MaxScorePicker())
    for gw in sim.gateways.models:
        gw.router.profile = profile
        gw.router.profile_name = ORACLE_POLICY
    return scorer
