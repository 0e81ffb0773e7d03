import random

import pytest

from policies.scheduling.builtin_profiles import (
    BUILTIN_PROFILE_NAMES,
    build_builtin_profile,
    builtin_profile_spec,
)
from tests.policies.scheduling.builders import NOW, context, names, replica

HOT = {"a": 128}  # replica a holds the whole 128-block prompt


def test_the_names_the_benchmark_compares() -> None:
    assert set(BUILTIN_PROFILE_NAMES) == {
        "default", "weighted", "predicted-latency", "kv-fit", "round-robin", "least-loaded", "prefix-only",
        "random",
    }  # fmt: skip


def test_kv_fit_is_the_default_plus_the_kv_fit_scorer() -> None:
    default, kv_fit = builtin_profile_spec("default"), builtin_profile_spec("kv-fit")
    assert kv_fit["filters"] == default["filters"] and kv_fit["picker"] == default["picker"]
    assert kv_fit["scorers"] == [*default["scorers"], {"type": "kv-fit", "weight": 5.0}]


def test_weighted_is_todays_default_by_name() -> None:
    assert builtin_profile_spec("weighted") == builtin_profile_spec("default")
    spec = builtin_profile_spec("weighted")
    spec["scorers"].clear()
    assert builtin_profile_spec("default")["scorers"]


def test_predicted_latency_profile() -> None:
    spec = builtin_profile_spec("predicted-latency")
    assert [s["type"] for s in spec["scorers"]] == ["predicted-latency", "prefix-affinity", "lora-locality"]
    assert "load-guard" not in [f["type"] for f in spec["filters"]]


@pytest.mark.parametrize("name", BUILTIN_PROFILE_NAMES)
def test_every_builtin_builds(name: str) -> None:
    profile = build_builtin_profile(name)
    assert [f.name for f in profile.filters][:5] == [
        "in-service", "healthy", "serves-model", "serves-adapter", "slow-start"
    ]


def test_specs_are_fresh_copies() -> None:
    spec = builtin_profile_spec("default")
    spec["scorers"].clear()
    assert builtin_profile_spec("default")["scorers"]


def test_unknown_builtin() -> None:
    with pytest.raises(KeyError, match="known: default"):
        builtin_profile_spec("fastest")


def test_default_filter_and_scorer_types() -> None:
    spec = builtin_profile_spec("default")
    assert [f["type"] for f in spec["filters"]] == [
        "in-service",
        "healthy",
        "serves-model",
        "serves-adapter",
        "slow-start",
        "in-flight-cap",
        "latency-knee",
        "fresh",
        "load-guard",
    ]
    assert [s["type"] for s in spec["scorers"]] == [
        "prefix-affinity",
        "queue-depth",
        "lora-locality",
        "session-affinity",
    ]


@pytest.mark.parametrize(
    ("a_load", "b_load", "winner"),
    [
        ((30, 20), (0, 2), "b"),  # (waiting, in_flight): a's queue is much longer -> the guard pulls away
        ((0, 60), (0, 10), "b"),
        ((1, 4), (0, 4), "a"),  # comparable queues -> the cache hit wins
        ((0, 12), (0, 6), "a"),
        ((0, 22), (0, 6), "a"),  # 16 ahead: still within the guard's slack
        ((0, 23), (0, 6), "b"),  # 17 ahead: pulled away
        ((0, 0), (0, 0), "a"),
    ],
)
def test_default_does_not_herd_a_hot_prefix(
    a_load: tuple[int, int], b_load: tuple[int, int], winner: str
) -> None:
    candidates = [
        replica("a", waiting=a_load[0], in_flight=a_load[1], kv_usage=0.6),
        replica("b", waiting=b_load[0], in_flight=b_load[1], kv_usage=0.3),
        replica("c", waiting=b_load[0] + 3, in_flight=b_load[1] + 3, kv_usage=0.3),
    ]
    ctx = context(prefix_match=HOT, prefix_blocks=128)
    for seed in range(5):
        d = build_builtin_profile("default").schedule(ctx, candidates, random.Random(seed))
        assert d.replica is not None and d.replica.name == winner


def test_prefix_only_herds_by_design() -> None:
    candidates = [replica("a", waiting=30, in_flight=20), replica("b")]
    d = build_builtin_profile("prefix-only").schedule(
        context(prefix_match=HOT, prefix_blocks=128), candidates, random.Random(0)
    )
    assert names(d.ranked) == ["a", "b"]


def test_default_routes_around_unhealthy_stale_and_wrong_replicas() -> None:
    candidates = [
        replica("sick", healthy=False),
        replica("other-model", pool="x"),
        replica("stale", scraped_at=NOW - 60),
        replica("ok", kv_usage=0.5),
    ]
    d = build_builtin_profile("default").schedule(context(), candidates, random.Random(0))
    assert names(d.ranked) == ["ok"]
    assert d.dropped == {"sick": "healthy", "other-model": "serves-model", "stale": "fresh"}


def test_default_keeps_a_full_kv_replica_that_holds_the_prefix() -> None:
    # With shared prefixes, high KV usage is mostly the prefix the request would reuse.
    candidates = [replica("a", kv_usage=0.99, in_flight=4), replica("b", kv_usage=0.2, in_flight=3)]
    d = build_builtin_profile("default").schedule(
        context(prefix_match=HOT, prefix_blocks=128), candidates, random.Random(0)
    )
    assert names(d.ranked)[0] == "a"


def test_default_prefers_the_active_adapter_and_the_session_replica() -> None:
    lora = [
        replica("slot", adapters=frozenset({"sql"}), max_loras=2),
        replica("active", adapters=frozenset({"sql"}), active_adapters=frozenset({"sql"}), max_loras=2),
        replica("none"),
    ]
    d = build_builtin_profile("default").schedule(context(adapter="sql"), lora, random.Random(0))
    assert names(d.ranked) == ["active", "slot"]
    plain = [replica("a"), replica("b"), replica("c")]
    d = build_builtin_profile("default").schedule(context(session_replica="c"), plain, random.Random(0))
    assert names(d.ranked)[0] == "c"


def test_least_loaded_and_round_robin() -> None:
    candidates = [replica("a", waiting=3), replica("b", in_flight=1), replica("c", waiting=9)]
    d = build_builtin_profile("least-loaded").schedule(
        context(prefix_match=HOT, prefix_blocks=128), candidates, random.Random(0)
    )
    assert names(d.ranked) == ["b", "a", "c"]
    firsts = [
        build_builtin_profile("round-robin")
        .schedule(context(sequence=s), candidates, random.Random(0))
        .ranked[0]
        .name
        for s in range(4)
    ]
    assert firsts == ["a", "b", "c", "a"]
