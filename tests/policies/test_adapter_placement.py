"""policies/adapter_placement: which replica loads an adapter, and which adapters make room for it."""

from __future__ import annotations

import pytest

from policies.adapter_placement import adapters_to_evict, placement_order
from tests.policies.scheduling.builders import replica


def test_placement_prefers_lora_replicas_free_slots_fewest_adapters_then_least_load() -> None:
    candidates = [
        replica("no-lora-known", max_loras=0),
        replica(
            "full-batch", max_loras=2, active_adapters=frozenset({"a", "b"}), adapters=frozenset({"a", "b"})
        ),
        replica("two-free-busy", max_loras=2, waiting=5),
        replica("two-free-many", max_loras=2, adapters=frozenset({"a", "b", "c"})),
        replica("two-free", max_loras=2, adapters=frozenset({"a"})),
        replica("two-free-idle", max_loras=2, adapters=frozenset({"a"})),
        replica("ejected", max_loras=4, healthy=False),
    ]
    order = [r.name for r in placement_order(candidates)]
    assert order == [
        "two-free-busy",
        "two-free",
        "two-free-idle",
        "two-free-many",
        "full-batch",
        "no-lora-known",
    ]


def test_placement_breaks_ties_by_load_then_name() -> None:
    candidates = [
        replica("b", max_loras=1, in_flight=2),
        replica("c", max_loras=1),
        replica("a", max_loras=1),
    ]
    assert [r.name for r in placement_order(candidates)] == ["a", "c", "b"]


MANAGED = {"a", "b", "c", "d"}


@pytest.mark.parametrize(
    ("loaded", "limit", "kw", "expected"),
    [
        ({"a", "b"}, None, {}, []),  # no limit
        ({"a", "b"}, 3, {}, []),  # room left
        ({"a", "b", "c"}, 3, {"last_used": {"a": 5.0, "b": 1.0, "c": 9.0}}, ["b"]),
        ({"a", "b", "c"}, 2, {"last_used": {"a": 5.0, "b": 1.0, "c": 9.0}}, ["b", "a"]),
        ({"a", "b", "c"}, 3, {"last_used": {"a": 5.0, "c": 9.0}}, ["b"]),  # never used: oldest
        ({"a", "b", "c"}, 3, {"last_used": {}, "active": {"a"}}, ["b"]),  # running now: kept
        ({"a", "b", "c"}, 3, {"last_used": {}, "busy": {"a", "b"}}, ["c"]),  # our requests in flight
        ({"a", "static"}, 2, {}, ["a"]),  # loaded outside kvgate: cannot be loaded again, kept
        ({"static"}, 1, {}, []),  # nothing may go: the limit is a target
        ({"a", "d"}, 2, {"adding": "d"}, []),  # already there: loading it adds nothing
    ],
)
def test_eviction_least_recently_used_among_what_may_go(
    loaded: set[str], limit: int | None, kw: dict[str, object], expected: list[str]
) -> None:
    adding = str(kw.pop("adding", "d"))
    assert adapters_to_evict(loaded, adding, limit, managed=MANAGED, **kw) == expected  # type: ignore[arg-type]
