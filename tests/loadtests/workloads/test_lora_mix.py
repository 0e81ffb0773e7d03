from __future__ import annotations

from collections import Counter

import pytest

from loadtests.workloads.lora_mix import LoraMixWorkload, zipf_weights
from tests.loadtests.workloads.tokens import count_tokens


@pytest.mark.parametrize(
    ("n", "s", "expected"),
    [
        (1, 1.0, [1.0]),
        (3, 0.0, [1 / 3, 1 / 3, 1 / 3]),
        (3, 1.0, [6 / 11, 3 / 11, 2 / 11]),
        (2, 2.0, [0.8, 0.2]),
    ],
)
def test_zipf_weights(n: int, s: float, expected: list[float]) -> None:
    assert zipf_weights(n, s) == pytest.approx(expected)


def test_skewed_popularity_matches_zipf() -> None:
    w = LoraMixWorkload(adapters=5, requests=20_000, prompt_tokens=4, output_tokens=2, zipf_s=1.0, seed=1)
    counts = Counter(s.body["model"] for s in w.requests())
    assert set(counts) == {f"lora-{i}" for i in range(5)}
    for name, p in zip(w.adapters, zipf_weights(5, 1.0), strict=True):
        assert counts[name] / 20_000 == pytest.approx(p, abs=0.015)
    assert counts["lora-0"] > 3 * counts["lora-4"]


def test_specs_name_the_adapter_and_share_its_system_prompt() -> None:
    w = LoraMixWorkload(
        adapters=["sql", "chat", "legal"], requests=60, prompt_tokens=30, output_tokens=8,
        system_prompt_tokens=50, base_model="tiny-llama", seed=2,
    )  # fmt: skip
    specs = list(w.requests())
    assert len(specs) == 60 == w.size()
    systems: dict[str, set[str]] = {}
    for s in specs:
        assert s.group == s.body["model"] and s.body["model"] in ("sql", "chat", "legal")
        system, user = s.body["messages"]
        assert count_tokens(system["content"]) == 50 and count_tokens(user["content"]) == 30
        systems.setdefault(s.group or "", set()).add(system["content"])
    assert all(len(v) == 1 for v in systems.values())
    assert w.describe()["popularity"]["sql"] == pytest.approx(6 / 11, abs=1e-6)


def test_seeded() -> None:
    def make(seed: int) -> LoraMixWorkload:
        return LoraMixWorkload(adapters=4, requests=50, prompt_tokens=10, output_tokens=4, seed=seed)

    assert list(make(1).requests()) == list(make(1).requests())
    assert [s.body for s in make(1).requests()] != [s.body for s in make(2).requests()]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"adapters": []},
        {"adapters": ["a", "a"]},
        {"zipf_s": -1.0},
        {"requests": 0},
        {"system_prompt_tokens": -1},
    ],
)
def test_rejects(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = dict(adapters=3, requests=5, prompt_tokens=5, output_tokens=5)
    args.update(kwargs)
    with pytest.raises(ValueError):
        LoraMixWorkload(**args)  # type: ignore[arg-type]
