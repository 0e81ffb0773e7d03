from __future__ import annotations

import itertools
from collections import Counter

import pytest

from loadtests.workloads.shared_prefix import SharedPrefixWorkload, size_shared_prefix
from tests.loadtests.workloads.tokens import count_tokens


def workload(seed: int = 0, **overrides: int) -> SharedPrefixWorkload:
    args = dict(groups=6, prompts_per_group=5, system_prompt_tokens=200, question_tokens=30, output_tokens=16)
    args.update(overrides)
    return SharedPrefixWorkload(**args, model="tiny-llama", seed=seed)  # type: ignore[arg-type]


def test_sizes_and_shape() -> None:
    specs = list(workload().requests())
    assert len(specs) == 30 == workload().size()
    assert Counter(s.group for s in specs) == {f"g{g}": 5 for g in range(6)}
    assert len({s.request_id for s in specs}) == 30
    for s in specs:
        system, user = s.body["messages"]
        assert system["role"] == "system" and user["role"] == "user"
        assert count_tokens(system["content"]) == 200 and count_tokens(user["content"]) == 30
        assert s.body["max_tokens"] == 16 and s.body["stream"] is True
        assert s.body["stream_options"] == {"include_usage": True}
        assert s.body["model"] == "tiny-llama" and s.endpoint == "chat" and s.session_id is None


def test_groups_share_their_system_prompt_and_nothing_else() -> None:
    specs = list(workload().requests())
    systems: dict[str, set[str]] = {}
    for s in specs:
        systems.setdefault(s.group or "", set()).add(s.body["messages"][0]["content"])
    assert all(len(v) == 1 for v in systems.values())
    firsts = [next(iter(v))[:64] for v in systems.values()]
    assert len(set(firsts)) == len(firsts)  # distinct from the first block on
    assert len({s.body["messages"][1]["content"] for s in specs}) == len(specs)


def test_same_seed_same_specs_other_seed_other_specs() -> None:
    assert list(workload(seed=1).requests()) == list(workload(seed=1).requests())
    a, b = list(workload(seed=1).requests()), list(workload(seed=2).requests())
    assert [s.body for s in a] != [s.body for s in b]
    assert [s.request_id for s in a] != [s.request_id for s in b]  # the order is seeded too


def test_groups_are_interleaved() -> None:
    groups = [s.group for s in workload(groups=10, prompts_per_group=10).requests()]
    runs = sum(1 for a, b in itertools.pairwise(groups) if a != b)
    assert runs > 60  # a grouped order would change group 9 times
    first_half = set(groups[:50])
    assert len(first_half) == 10


def test_completions_endpoint_puts_the_system_prompt_first() -> None:
    spec = next(workload().requests().__iter__())
    comp = next(SharedPrefixWorkload(
        groups=6, prompts_per_group=5, system_prompt_tokens=200, question_tokens=30, output_tokens=16,
        model="m", endpoint="completions",
    ).requests())  # fmt: skip
    assert spec.endpoint == "chat"
    assert comp.endpoint == "completions"
    assert "messages" not in comp.body and count_tokens(comp.body["prompt"]) == 230


@pytest.mark.parametrize(
    ("kv", "replicas", "prompt", "target", "groups", "multiple"),
    [
        (16_384, 8, 1_024, 4.0, 64, 4.0),  # the docstring's example
        (16_384, 8, 1_000, 4.0, 66, 66_000 / 16_384),  # rounding to the nearest group count
        (16_384, 5, 1_024, 4.0, 60, 3.75),  # f x R = 3.75 caps the aim
        (16_384, 4, 1_024, 4.0, 48, 3.0),  # exactly the minimum that fits
        (412_000, 8, 6_000, 6.0, 412, 412 * 6_000 / 412_000),  # the published 6x case
        (10_000, 8, 2_400, 4.0, 17, 4.08),  # coarse prompts land near the target
    ],
)
def test_sizing_arithmetic(
    kv: int, replicas: int, prompt: int, target: float, groups: int, multiple: float
) -> None:
    sizing = size_shared_prefix(kv, replicas, prompt, target_multiple=target)
    assert sizing.groups == groups
    assert sizing.prefix_tokens_total == groups * prompt
    assert sizing.multiple_of_replica == pytest.approx(multiple)
    assert 3.0 <= sizing.multiple_of_replica <= 6.0
    assert sizing.fraction_of_fleet <= 0.75
    assert sizing.fraction_of_fleet == pytest.approx(groups * prompt / (replicas * kv))


@pytest.mark.parametrize(
    ("kv", "replicas", "prompt", "message"),
    [
        (16_384, 3, 1_024, "at least 4 replicas"),  # 0.75 x 3 = 2.25x one replica < 3x
        (16_384, 8, 4_097, "more than a quarter"),  # a replica could not hold a few groups
        (16_384, 8, 0, "system_prompt_tokens must be > 0"),
    ],
)
def test_sizing_refuses_what_cannot_work(kv: int, replicas: int, prompt: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        size_shared_prefix(kv, replicas, prompt)


def test_sizing_checks_its_multiples() -> None:
    with pytest.raises(ValueError, match="min_multiple <= target_multiple"):
        size_shared_prefix(16_384, 8, 1_024, target_multiple=7.0)


def test_sized_workload_describes_its_sizing() -> None:
    w = SharedPrefixWorkload.sized(
        replica_kv_tokens=16_384, replicas=8, prompts_per_group=4, system_prompt_tokens=1_024,
        question_tokens=50, output_tokens=32, model="tiny-llama",
    )  # fmt: skip
    d = w.describe()
    assert w.groups == 64 and d["requests"] == 256 and d["prefix_tokens_total"] == 65_536
    assert d["sizing"]["multiple_of_replica"] == 4.0 and d["sizing"]["fraction_of_fleet"] == 0.5


@pytest.mark.parametrize("bad", [{"groups": 0}, {"question_tokens": 0}, {"output_tokens": -1}])
def test_rejects_non_positive_sizes(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        workload(**bad)
