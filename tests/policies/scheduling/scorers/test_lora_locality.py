import pytest

from policies.scheduling.scorers.lora_locality import LoraLocalityScorer
from tests.policies.scheduling.builders import context, replica

CANDIDATES = [
    replica("active", adapters=frozenset({"sql", "x"}), active_adapters=frozenset({"sql"}), max_loras=2),
    replica("slot", adapters=frozenset({"sql", "x"}), active_adapters=frozenset({"x"}), max_loras=2),
    replica(
        "busy", adapters=frozenset({"sql", "x", "y"}), active_adapters=frozenset({"x", "y"}), max_loras=2
    ),
    replica("unknown-slots", adapters=frozenset({"sql"})),  # max_loras not scraped yet
    replica("absent", adapters=frozenset({"x"}), max_loras=4),
]


@pytest.mark.parametrize(
    ("adapter", "expected"),
    [
        ("sql", [1.0, 0.5, 0.0, 0.5, 0.0]),
        ("x", [0.5, 1.0, 1.0, 0.0, 0.5]),
        (None, [1.0, 1.0, 1.0, 1.0, 1.0]),  # no adapter: neutral
    ],
)
def test_active_beats_free_slot_beats_neither(adapter: str | None, expected: list[float]) -> None:
    assert list(LoraLocalityScorer().score(context(adapter=adapter), CANDIDATES)) == expected
