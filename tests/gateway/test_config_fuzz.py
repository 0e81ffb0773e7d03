"""Fuzzed configs: the example configs (config/*.example.yaml) with a few values replaced by any
YAML value, or removed, and arbitrary YAML text. Every one either loads or is refused with
ConfigError (what `kvgate check-config` and a reload report, naming the field); none raises
anything else, which would end `kvgate serve` or a reload with a traceback instead of a reason."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Config, ConfigError, config_from_text, parse_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
EXAMPLES = {p.name: yaml.safe_load(p.read_text()) for p in sorted(CONFIG_DIR.glob("*.example.yaml"))}

_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-2, 5)
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from(["", "0", "1s", "none", "all", "critical", "day", "http://127.0.0.1:1", "llama-3-8b"])
)
_value = st.recursive(
    _scalar, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=6,
)  # fmt: skip


def _places(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key of every mapping and every index of every list below `node`, as paths."""
    out: list[tuple[Any, ...]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*at, k))
            out.extend(_places(v, (*at, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((*at, i))
            out.extend(_places(v, (*at, i)))
    return out


def _refused_or_loaded(data: Any) -> None:
    try:
        assert isinstance(parse_config(data, config_dir=CONFIG_DIR), Config)
    except ConfigError as err:
        assert str(err)


def test_every_example_loads_as_it_is() -> None:
    assert len(EXAMPLES) >= 3
    for data in EXAMPLES.values():
        assert isinstance(parse_config(data, config_dir=CONFIG_DIR), Config)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), name=st.sampled_from(sorted(EXAMPLES)), changes=st.integers(1, 4))
def test_an_example_with_values_replaced_or_removed_loads_or_is_refused_with_a_reason(
    data: st.DataObject, name: str, changes: int
) -> None:
    config = copy.deepcopy(EXAMPLES[name])
    for _ in range(changes):
        places = _places(config)
        if not places:
            break
        *parents, last = data.draw(st.sampled_from(places))
        node = config
        for key in parents:
            node = node[key]
        if data.draw(st.booleans()):
            del node[last]  # a key of a mapping, or an item of a list
        else:
            node[last] = data.draw(_value)
    _refused_or_loaded(config)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200) | st.builds(lambda v: yaml.safe_dump(v), _value))
def test_any_text_loads_or_is_refused_with_a_reason(text: str) -> None:
    try:
        assert isinstance(config_from_text(text, "fuzz.yaml"), Config)
    except ConfigError as err:
        assert str(err)
