"""Which settings a reload may change (gateway/reload_scope.py): every setting of the config is
classified, a changed path is found field by field, and a restart-only change is named with why."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import BaseModel

from gateway.config import Config, parse_config
from gateway.reload_scope import HOT, RESTART_ONLY, changed_paths, classify, restart_needed


def leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every setting of `model`, by dotted path, down to what `changed_paths` compares whole."""
    out: list[str] = []
    for name, f in model.model_fields.items():
        ann: Any = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += leaf_paths(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_every_setting_is_classified_hot_or_restart_only() -> None:
    # A setting added to Config must be put in one of the two tables (a new section such as
    # `routes:` too): unclassified, a reload refuses any change to it.
    unclassified = [p for p in leaf_paths(Config) if classify(p)[1] == "not known to be reloadable"]
    assert unclassified == []
    assert not set(HOT) & set(RESTART_ONLY)


@pytest.mark.parametrize(
    ("path", "hot"),
    [
        ("tenants", True),
        ("auth.admin_keys", True),
        ("scheduling.profiles", True),
        ("scheduling.prefix_index.block_tokens", False),
        ("discovery.file", True),
        ("flow_control.bands", True),
        ("flow_control.enabled", False),
        ("server.port", False),
        ("server.max_body_bytes", True),
        ("state.store", False),
        ("upstream.max_retries", False),
        ("routes", True),
        ("ledger", False),
    ],
)
def test_classify(path: str, hot: bool) -> None:
    assert classify(path)[0] is hot


def test_changed_paths_goes_down_sections_and_compares_the_rest_whole() -> None:
    old = parse_config({"tenants": [{"name": "a"}]})
    new = parse_config(
        {
            "tenants": [{"name": "a", "weight": 2}],
            "server": {"port": 9000, "debug_headers": True},
            "flow_control": {"bands": {"critical": {"max_wait_s": 1}}, "saturation": {"max_kv_usage": 0.5}},
        }
    )
    assert changed_paths(old, new) == [
        "server.port",
        "server.debug_headers",
        "tenants",
        "flow_control.saturation.max_kv_usage",
        "flow_control.bands",
    ]
    assert changed_paths(old, old) == []


def test_restart_needed_names_each_setting_and_why() -> None:
    old = parse_config({})
    new = parse_config(
        {"server": {"host": "0.0.0.0", "debug_headers": True}, "state": {"store": "redis://r:6379/0"}}
    )
    assert restart_needed(old, new) == [
        "server.host (the listen address)",
        "state.store (the rate-limit store is built with it at start)",
    ]
    assert (
        restart_needed(old, parse_config({"tenants": [{"name": "a"}], "server": {"debug_headers": True}}))
        == []
    )


def test_optional_sections_are_compared_whole() -> None:
    ann = Config.model_fields["discovery"].annotation
    assert ann is not None and issubclass(ann, BaseModel)
    file_field = ann.model_fields["file"].annotation
    assert type(None) in get_args(file_field)  # Optional: compared whole, under `discovery`
    new = parse_config({"discovery": {"file": {"path": "/etc/r.yaml"}}})
    assert changed_paths(parse_config({}), new) == ["discovery.file"]
