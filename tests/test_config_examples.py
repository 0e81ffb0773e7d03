"""Every example config in config/ loads, passes the semantic checks, and says something real."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config_check import load_checked

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "config").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads(path: Path) -> None:
    config = load_checked(path)  # what every kvgate command does with it
    assert config.replicas or config.discovery.configured or config.simulator.replicas >= 1

