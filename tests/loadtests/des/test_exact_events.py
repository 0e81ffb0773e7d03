"""The DES's exact index: every gateway's `ExactIndex` fed by the engines' KV events, `event_lag_s` late."""

from __future__ import annotations

import pytest

from loadtests.des import DesConfig, FleetSpec, Simulation
from loadtests.des.gateways import GatewayViews
from loadtests.des.outcome import DesResult
from loadtests.runner import LoadConfig
from loadtests.workloads import SharedPrefixWorkload
from loadtests.workloads.spec import RequestSpec
from policies.exact_index import ExactIndex
from simulator.kv_events.events import external_hash

pytestmark = pytest.mark.timeout(120)
INF = float("inf")
FLEET = FleetSpec(replicas=4, profile="tiny")


def specs(n: int, groups: int = 6, seed: int = 0) -> list[RequestSpec]:
    work = SharedPrefixWorkload(groups=groups, prompts_per_group=n // groups + 1, system_prompt_tokens=256,
                                question_tokens=16, output_tokens=8, model=FLEET.model_name, seed=seed)
    return list(work.requests())[:n]


def closed(concurrency: int) -> LoadConfig:
    return LoadConfig(concurrency=concurrency, duration_s=INF)


def ok(result: DesResult) -> int:
    return sum(1 for t in result.traces if t.error is None)


def engine_hashes(sim: Simulation, replica: int) -> set[int]:
    # What the engine's prefix cache holds, as its events name the blocks.
    cache = sim.replicas[replica].engine._cache
    return {external_hash(key) for key in cache._cached}


def exact_index(sim: Simulation, gateway: int) -> ExactIndex:
    exact = sim.gateways.models[gateway].router.exact
    assert exact is not None
    return exact.index


def test_every_gateways_exact_index_holds_what_the_engines_hold_once_the_lag_has_passed() -> None:
    lag = 1000.0  # longer than the run: nothing has arrived when it ends
    sim = Simulation(DesConfig(FLEET, views=GatewayViews(gateways=2, index="exact", event_lag_s=lag)))
    assert ok(sim.run(specs(60), closed(8))) == 60
    held = [engine_hashes(sim, i) for i in range(FLEET.replicas)]
    assert sum(map(len, held)) > 0
    names = sim.gateway.names
    for k in range(2):
        assert all(exact_index(sim, k).held_hashes(n) == set() for n in names)  # still in transit
    sim.idle(lag)
    for k in range(2):
        index = exact_index(sim, k)
        for i, name in enumerate(names):
            assert index.held_hashes(name) == held[i]
            assert index.complete(name)
    # Same events, same order: the two gateways' pictures are the same by construction.
    assert [exact_index(sim, 0).held_hashes(n) for n in names] == [exact_index(sim, 1).held_hashes(n)
                                                                   for n in names]  # fmt: skip


def test_with_evictions_the_index_still_matches_the_engine() -> None:
    # Small caches: the engines evict, and the BlockRemoved events must take blocks out again.
    fleet = FleetSpec(replicas=2, profile="tiny", engine=FLEET.engine.__class__(num_gpu_blocks=64))
    sim = Simulation(DesConfig(fleet, views=GatewayViews(gateways=3, index="exact")))
    assert ok(sim.run(specs(80, groups=12), closed(4))) == 80
    sim.idle(1.0)
    for k in range(3):
        for i, name in enumerate(sim.gateway.names):
            assert exact_index(sim, k).held_hashes(name) == engine_hashes(sim, i)


@pytest.mark.parametrize("index", ["approximate", "exact"])
def test_a_gateway_routes_on_a_prefix_another_gateway_placed_only_with_the_exact_index(index: str) -> None:
    sim = Simulation(DesConfig(FLEET, tokenizer="sim", views=GatewayViews(gateways=2, index=index)))
    first, second = specs(12, groups=1)[:2]  # one shared system prompt, two questions
    assert ok(sim.run([first], closed(1))) == 1
    placed = [i for i, r in enumerate(sim.replicas) if r.routed]
    assert len(placed) == 1
    sim.idle(1.0)
    sim.begin([second], closed(1))
    while not sim.open and sim.step():
        pass
    (o,) = sim.open.values()
    assert o.routed is not None
    assert o.routed.gateway == 0 and sim.gateways.models[0].routed == 1  # gateway 1 routed the first
    if index == "exact":
        # Gateway 0 never routed that prefix; the engine's events told it where it is.
        assert o.replica == placed[0]
        assert o.routed.matched_blocks > 0
    else:
        assert o.routed.matched_blocks == 0  # its own approximate index never learnt it
    while sim.step():
        pass
    assert ok(sim.finish()) == 1


def test_views_take_the_exact_index_and_check_the_lag() -> None:
    assert GatewayViews(index="exact", event_lag_s=0.0).exact
    assert not GatewayViews().exact
    with pytest.raises(ValueError, match="index"):
        GatewayViews(index="telepathy")
    with pytest.raises(ValueError, match="event_lag_s"):
        GatewayViews(index="exact", event_lag_s=-1)
    with pytest.raises(ValueError, match="sim tokenizer"):
        Simulation(DesConfig(FLEET, tokenizer="none", views=GatewayViews(index="exact")))
