"""The bench-only placement oracle (loadtests/placement_oracle.py) and its runs in kv_fit_bench."""

from __future__ import annotations

import pytest

from loadtests.kv_fit_bench import run_one
from loadtests.placement_oracle import PartitionScorer
from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState, RequestInfo

NAMES = ("a", "b", "c")
CANDIDATES = [ReplicaState(name=n, url="", pool="m") for n in NAMES]


def _score(scorer: PartitionScorer, group: int, question: int) -> str:
    """The replica the scorer sends a prompt of `group` to (its first two keys name the group)."""
    keys = (group * 100, group * 100 + 1, 10_000 + question)
    info = RequestInfo(
        model="m", base_model="m", adapter=None, prompt_tokens=1, max_tokens=1, prefix_keys=keys
    )
    scores = scorer.score(
        SchedulingContext(request=info, now=0.0, prefix_match={}, prefix_blocks=len(keys)), CANDIDATES
    )
    assert sorted(scores) == [0.0, 0.0, 1.0]
    return NAMES[list(scores).index(1.0)]


def test_groups_are_dealt_round_robin_by_first_appearance_and_stay() -> None:
    scorer = PartitionScorer()
    firsts = [_score(scorer, g, 0) for g in (7, 3, 9, 1)]
    assert firsts == ["a", "b", "c", "a"]
    assert [_score(scorer, g, q) for q, g in enumerate((9, 7, 1, 3, 9))] == ["c", "a", "a", "b", "c"]
    assert len(scorer.assignment) == 4


def test_weights_deal_groups_in_proportion() -> None:
    scorer = PartitionScorer(weights=(2, 1, 1))
    homes = [_score(scorer, g, 0) for g in range(12)]
    assert [homes.count(n) for n in NAMES] == [6, 3, 3]


def test_weights_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weights"):
        PartitionScorer(weights=(1, 0))


def test_the_oracle_run_splits_the_groups_evenly_and_sees_each_group() -> None:
    # run_one raises when the oracle's groups are not the workload's (a key naming two groups).
    oracle = run_one("placement-oracle", 2, 0.75, seed=1)
    assert oracle.groups == 12 and oracle.groups_per_replica == (6, 6)
    assert 0 < oracle.hit_rate < oracle.oracle
    assert run_one("static-2:1", 2, 0.75, seed=1).groups_per_replica == (8, 4)


def test_a_run_with_flow_control_reports_what_the_gate_held() -> None:
    # At 2 clients per replica on 16-sequence replicas the latency gate holds some requests at kvgate.
    plain = run_one("default", 2, 0.75, seed=1)
    gated = run_one("default", 2, 0.75, seed=1, flow_control=True)
    assert plain.held is None
    assert gated.held is not None and gated.held > 0 and gated.groups == plain.groups
