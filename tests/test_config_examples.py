"""Every example config in config/ loads, passes the semantic checks, and says something real."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config_check import check_semantics, load_checked

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "config").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads(path: Path) -> None:
    config = load_checked(path)  # what every kvgate command does with it
    assert config.replicas or config.simulator.replicas >= 1


def test_kubernetes_configmap_holds_a_valid_config() -> None:
    import yaml

    from gateway.config import parse_config

    manifest = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "kvgate.yaml"
    docs = list(yaml.safe_load_all(manifest.read_text()))
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    config = parse_config(yaml.safe_load(configmap["data"]["kvgate.yaml"]))
    check_semantics(config)
    assert config.replicas and config.state.store.startswith("redis://")
