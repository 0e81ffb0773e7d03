"""`in-flight-cap`: a replica at flow control's per-replica cap is not a candidate while another is
below it; with every candidate at the cap (or no cap), nothing is dropped."""

from __future__ import annotations

import random

import pytest

from policies.scheduling.filters.in_flight_cap import InFlightCapFilter
from policies.scheduling.profile import SchedulingProfile
from policies.scheduling.registry import build_profile
from tests.policies.scheduling.builders import context, names, replica


@pytest.mark.parametrize(
    ("cap", "in_flight", "kept"),
    [
        (None, (5, 0), ["a", "b"]),  # flow control off: no cap
        (4, (3, 0), ["a", "b"]),
        (4, (4, 0), ["b"]),  # a is at the cap
        (4, (9, 3), ["b"]),
        (4, (4, 4), []),  # all at the cap: the profile skips this soft filter (tested below)
        (1, (1, 0), ["b"]),
    ],
)
def test_keeps_the_replicas_below_the_cap(
    cap: int | None, in_flight: tuple[int, int], kept: list[str]
) -> None:
    candidates = [replica("a", in_flight=in_flight[0]), replica("b", in_flight=in_flight[1])]
    got = InFlightCapFilter().filter(context(max_in_flight_per_replica=cap), candidates)
    assert names(got) == kept


def test_with_every_replica_at_the_cap_the_profile_still_serves() -> None:
    profile = build_profile({"filters": [{"type": "in-flight-cap"}], "scorers": []})
    both = [replica("a", in_flight=2), replica("b", in_flight=2)]
    ranked = profile.schedule(context(max_in_flight_per_replica=2), both, random.Random(0)).ranked
    assert sorted(names(ranked)) == ["a", "b"]


def test_it_is_soft_and_in_every_built_in_profile() -> None:
    assert InFlightCapFilter.soft
    from policies.scheduling.builtin_profiles import BUILTIN_PROFILE_NAMES, builtin_profile_spec

    for name in BUILTIN_PROFILE_NAMES:
        assert {"type": "in-flight-cap"} in builtin_profile_spec(name)["filters"], name


def test_the_default_profile_no_longer_piles_a_shared_prefix_onto_a_replica_at_its_cap() -> None:
    """The bug: the prefix holder at its cap of 1 still won (prefix 3 x 1 against queue 2 x 1)."""
    profile: SchedulingProfile = build_profile(
        {"filters": [{"type": "in-flight-cap"}], "scorers": [{"type": "prefix-affinity", "weight": 3.0},
                                                              {"type": "queue-depth", "weight": 2.0}]}
    )  # fmt: skip
    holder, other = replica("a", in_flight=1), replica("b", in_flight=0)
    ctx = context(prefix_match={"a": 4}, prefix_blocks=4, max_in_flight_per_replica=1)
    assert names(profile.schedule(ctx, [holder, other], random.Random(0)).ranked)[0] == "b"
    uncapped = context(prefix_match={"a": 4}, prefix_blocks=4)
    assert names(profile.schedule(uncapped, [holder, other], random.Random(0)).ranked)[0] == "a"
