from __future__ import annotations

import pytest

from loadtests.workloads.random_prompts import RandomWorkload
from tests.loadtests.workloads.tokens import count_tokens


def test_unique_prompts_of_the_given_length() -> None:
    w = RandomWorkload(requests=200, prompt_tokens=64, output_tokens=8, model="m", seed=1)
    specs = list(w.requests())
    prompts = [s.body["messages"][0]["content"] for s in specs]
    assert len(specs) == 200 == w.size()
    assert all(count_tokens(p) == 64 for p in prompts)
    assert len({p[:40] for p in prompts}) == 200  # nothing shared, not even the first block
    assert all(s.group is None and s.session_id is None and s.tenant is None for s in specs)


def test_length_jitter_spreads_lengths_within_bounds() -> None:
    w = RandomWorkload(requests=300, prompt_tokens=100, output_tokens=8, model="m", length_jitter=0.5)
    lengths = [count_tokens(s.body["messages"][0]["content"]) for s in w.requests()]
    assert min(lengths) >= 50 and max(lengths) <= 150
    assert max(lengths) - min(lengths) > 60


def test_seeded() -> None:
    def make(seed: int) -> RandomWorkload:
        return RandomWorkload(requests=20, prompt_tokens=30, output_tokens=4, model="m", seed=seed)

    assert list(make(5).requests()) == list(make(5).requests())
    assert [s.body for s in make(5).requests()] != [s.body for s in make(6).requests()]


def test_completions_endpoint() -> None:
    spec = next(
        iter(
            RandomWorkload(
                requests=1, prompt_tokens=30, output_tokens=4, model="m", endpoint="completions"
            ).requests()
        )
    )
    assert spec.endpoint == "completions" and count_tokens(spec.body["prompt"]) == 30


@pytest.mark.parametrize("jitter", [-0.1, 1.0])
def test_rejects_bad_jitter(jitter: float) -> None:
    with pytest.raises(ValueError):
        RandomWorkload(requests=1, prompt_tokens=5, output_tokens=5, model="m", length_jitter=jitter)
    with pytest.raises(ValueError):
        RandomWorkload(requests=1, prompt_tokens=5, output_tokens=5, model="m", output_jitter=jitter)


def test_output_jitter_spreads_output_caps_around_the_mean() -> None:
    def make(j: float) -> list:
        return list(
            RandomWorkload(requests=300, prompt_tokens=40, output_tokens=64, model="m", seed=3,
                           length_jitter=0.25, output_jitter=j).requests()
        )  # fmt: skip

    fixed, spread = make(0.0), make(0.5)
    caps = [s.body["max_tokens"] for s in spread]
    assert {s.body["max_tokens"] for s in fixed} == {64}
    assert min(caps) >= 32 and max(caps) <= 96 and max(caps) - min(caps) > 40
    assert 58 <= sum(caps) / len(caps) <= 70  # the mean stays near output_tokens
    assert make(0.5) == spread  # seeded
    assert RandomWorkload(requests=1, prompt_tokens=5, output_tokens=5, model="m").describe()[
        "output_jitter"
    ] == 0.0
