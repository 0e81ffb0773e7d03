import pytest

from policies.scheduling.filters.serves_adapter import ServesAdapterFilter
from tests.policies.scheduling.builders import context, names, replica

CANDIDATES = [
    replica("listed", adapters=frozenset({"sql", "chat"}), max_loras=2),
    replica("other", adapters=frozenset({"chat"}), max_loras=2),
    replica("no-lora"),
]


@pytest.mark.parametrize(
    ("adapter", "allow_loadable", "kept"),
    [
        (None, False, ["listed", "other", "no-lora"]),  # a base-model request: every replica serves it
        ("sql", False, ["listed"]),
        ("chat", False, ["listed", "other"]),
        ("absent", False, []),
        ("sql", True, ["listed", "other"]),  # LoRA enabled, loads on demand
        ("absent", True, ["listed", "other"]),
    ],
)
def test_adapter_filter(adapter: str | None, allow_loadable: bool, kept: list[str]) -> None:
    f = ServesAdapterFilter(allow_loadable=allow_loadable)
    assert names(f.filter(context(adapter=adapter), CANDIDATES)) == kept


def test_is_hard() -> None:
    assert ServesAdapterFilter.soft is False
