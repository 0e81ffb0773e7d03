from __future__ import annotations

from collections import Counter

import pytest

from loadtests.workloads.noisy_neighbour import NoisyNeighbourWorkload, TenantShare


def test_default_tenants_one_far_above_its_share() -> None:
    w = NoisyNeighbourWorkload(requests=10_000, prompt_tokens=8, output_tokens=4, model="m", seed=1)
    specs = list(w.requests())
    counts = Counter(s.tenant for s in specs)
    assert counts["noisy"] / 10_000 == pytest.approx(0.7, abs=0.02)
    for quiet in ("quiet-a", "quiet-b", "quiet-c"):
        assert counts[quiet] / 10_000 == pytest.approx(0.1, abs=0.015)
    tenants = {t["name"]: t for t in w.describe()["tenants"]}
    assert tenants["noisy"]["offered_share"] == pytest.approx(0.7)
    assert tenants["noisy"]["fair_share"] == pytest.approx(0.25)


def test_specs_carry_tenant_and_key() -> None:
    tenants = [TenantShare("big", 3.0, api_key="key-big"), TenantShare("small", 1.0)]
    w = NoisyNeighbourWorkload(requests=400, prompt_tokens=8, output_tokens=4, model="m", tenants=tenants)
    keys = {s.tenant: s.api_key for s in w.requests()}
    assert keys == {"big": "key-big", "small": "sk-small"}
    counts = Counter(s.tenant for s in w.requests())
    assert counts["big"] / 400 == pytest.approx(0.75, abs=0.06)
    assert all(s.group == s.tenant for s in w.requests())


def test_seeded() -> None:
    def make(seed: int) -> NoisyNeighbourWorkload:
        return NoisyNeighbourWorkload(requests=50, prompt_tokens=8, output_tokens=4, model="m", seed=seed)

    assert list(make(1).requests()) == list(make(1).requests())
    assert [s.tenant for s in make(1).requests()] != [s.tenant for s in make(2).requests()]


@pytest.mark.parametrize(
    "tenants",
    [
        [TenantShare("only", 1.0)],
        [TenantShare("a", 1.0), TenantShare("a", 2.0)],
        [TenantShare("a", 1.0), TenantShare("b", 0.0)],
    ],
)
def test_rejects(tenants: list[TenantShare]) -> None:
    with pytest.raises(ValueError):
        NoisyNeighbourWorkload(requests=5, prompt_tokens=5, output_tokens=5, model="m", tenants=tenants)
