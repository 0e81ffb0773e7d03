"""A smoke run of the decision benchmark, so it keeps working (its figures are not asserted)."""

import random

from loadtests.decision_bench import run_cell, warm_fleet
from policies.scheduling.builtin_profiles import build_builtin_profile


def test_a_small_cell_runs_and_reports_consistent_figures() -> None:
    row = run_cell(tokens=1024, replicas=4, decisions=30, seed=1, profile=build_builtin_profile("default"))
    assert row.blocks == 16 or row.blocks == 17  # ~1k tokens of chat at 64-token (256-byte) blocks
    assert 0 < row.p50_us <= row.p90_us <= row.p99_us <= row.max_us
    assert set(row.stage_p50_us) == {"canonical", "keys", "match", "schedule"}
    assert 0.0 < row.matched_share < 1.0  # the mix has hits and misses


def test_the_warm_index_is_full_and_the_mix_matches_it() -> None:
    index, names, mix = warm_fleet(random.Random(3), tokens=1024, replicas=4, requests=6)
    sizes = index.replica_sizes()
    assert sorted(sizes) == names
    assert all(size == index.capacity(n) for n, size in sizes.items())
    assert len(mix) == 6
