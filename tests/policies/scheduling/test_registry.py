import random
from typing import Any

import pytest

from policies.scheduling.filters.kv_full import KvFullFilter
from policies.scheduling.registry import PLUGIN_TYPES, build_profile, plugin_params
from tests.policies.scheduling.builders import context, replica

EXAMPLE = {
    "filters": [{"type": "healthy"}, {"type": "kv-full", "params": {"threshold": 0.9}}],
    "scorers": [
        {"type": "prefix-affinity", "weight": 3.0},
        {"type": "queue-depth", "weight": 2, "name": "q"},
    ],
    "picker": {"type": "max-score"},
}


def test_builds_the_documented_example() -> None:
    profile = build_profile(EXAMPLE)
    assert [f.name for f in profile.filters] == ["healthy", "kv-full"]
    kv_full = profile.filters[1]
    assert isinstance(kv_full, KvFullFilter) and kv_full.threshold == 0.9
    assert [(w.scorer.name, w.weight) for w in profile.weighted_scorers] == [
        ("prefix-affinity", 3.0),
        ("q", 2.0),
    ]
    assert profile.picker.name == "max-score"
    d = profile.schedule(context(), [replica("a", waiting=5), replica("b")], random.Random(0))
    assert d.replica is not None and d.replica.name == "b"


def test_defaults_and_nones_count_as_absent() -> None:
    profile = build_profile(
        {
            "filters": [{"type": "healthy", "name": None, "params": None, "weight": None}],
            "scorers": [{"type": "kv-headroom"}],
        }
    )
    assert profile.filters[0].name == "healthy"
    assert profile.weighted_scorers[0].weight == 1.0
    assert profile.picker.name == "max-score"
    assert build_profile({}).picker.name == "max-score"


@pytest.mark.parametrize("type_name", sorted(PLUGIN_TYPES))
def test_every_type_builds_in_its_slot_with_default_params(type_name: str) -> None:
    kind = PLUGIN_TYPES[type_name].kind
    entry = {"type": type_name}
    spec: dict[str, Any] = {
        "filter": {"filters": [entry]},
        "scorer": {"scorers": [entry]},
        "picker": {"picker": entry},
    }[kind]
    profile = build_profile(spec)
    plugin = {
        "filter": lambda: profile.filters[0],
        "scorer": lambda: profile.weighted_scorers[0].scorer,
        "picker": lambda: profile.picker,
    }[kind]()
    assert plugin.name == type_name
    method = {"filter": "filter", "scorer": "score", "picker": "pick"}[kind]
    assert callable(getattr(plugin, method))


def test_type_names_are_kebab_case() -> None:
    for name in PLUGIN_TYPES:
        assert name == name.lower() and " " not in name and "_" not in name


def test_plugin_params_lists_defaults() -> None:
    assert plugin_params("kv-full") == {"threshold": 0.98}
    assert plugin_params("load-guard") == {"abs_slack": 8.0, "rel_slack": 0.5}
    assert plugin_params("healthy") == {}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"filters": [{"type": "nope"}]},
            r"filters\[0\] \(type 'nope'\): unknown plugin type; known filter types: healthy, fresh",
        ),
        ({"scorers": [{"type": "healthy"}]}, r"scorers\[0\] \(type 'healthy'\): is a filter, not a scorer"),
        ({"picker": {"type": "queue-depth"}}, r"picker \(type 'queue-depth'\): is a scorer, not a picker"),
        (
            {"scorers": [{"type": "queue-depth", "name": "q"}, {"type": "kv-headroom", "name": "q"}]},
            r"scorers\[1\] \(type 'kv-headroom'\): duplicate plugin name 'q' \(also used by scorers\[0\]",
        ),
        (
            {"filters": [{"type": "healthy"}], "scorers": [{"type": "queue-depth", "name": "healthy"}]},
            r"scorers\[0\] .*duplicate plugin name 'healthy'",
        ),
        (
            {"filters": [{"type": "kv-full", "params": {"limit": 1}}]},
            r"filters\[0\] \(type 'kv-full'\): unknown param 'limit'; known params: threshold",
        ),
        ({"filters": [{"type": "healthy", "params": {"x": 1}}]}, r"unknown param 'x'; known params: none"),
        (
            {"filters": [{"type": "kv-full", "params": {"threshold": "high"}}]},
            r"param 'threshold': must be float, got str",
        ),
        (
            {"filters": [{"type": "kv-full", "params": {"threshold": True}}]},
            r"param 'threshold': must be float, got bool",
        ),
        (
            {"filters": [{"type": "kv-full", "params": {"threshold": 1.5}}]},
            r"filters\[0\] \(type 'kv-full'\): threshold must be in \(0, 1\]",
        ),
        (
            {"filters": [{"type": "serves-adapter", "params": {"allow_loadable": 1}}]},
            r"param 'allow_loadable': must be bool",
        ),
        (
            {"scorers": [{"type": "queue-depth", "weight": -1}]},
            r"scorers\[0\]: weight must be finite and >= 0, got -1",
        ),
        (
            {"scorers": [{"type": "queue-depth", "weight": float("inf")}]},
            r"scorers\[0\]: weight must be finite",
        ),
        (
            {"scorers": [{"type": "queue-depth", "weight": "2"}]},
            r"scorers\[0\]: weight must be a number, got str",
        ),
        (
            {"filters": [{"type": "healthy", "weight": 2.0}]},
            r"filters\[0\] \(type 'healthy'\): only scorers take a weight",
        ),
        ({"filters": [{"name": "x"}]}, r"filters\[0\]: 'type' is required"),
        ({"filters": ["healthy"]}, r"filters\[0\]: must be a mapping with a 'type', got str"),
        ({"filters": [{"type": "healthy", "weigth": 1}]}, r"filters\[0\]: unknown keys \['weigth'\]"),
        ({"filters": {"type": "healthy"}}, r"filters: must be a list of plugin entries, got dict"),
        ({"scorer": []}, r"unknown profile keys \['scorer'\]"),
        ({"filters": [{"type": "healthy", "name": ""}]}, r"'name' must be a non-empty string"),
        ({"filters": [{"type": "healthy", "params": [1]}]}, r"'params' must be a mapping, got list"),
    ],
)
def test_refusals_name_the_entry(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_profile(spec)


def test_refuses_a_non_mapping_spec() -> None:
    with pytest.raises(ValueError, match="a profile must be a mapping"):
        build_profile([])  # type: ignore[arg-type]
