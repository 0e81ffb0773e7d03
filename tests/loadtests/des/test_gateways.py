"""N gateways in front of one simulated fleet: each its own ledger, index and scrapes; live routing code."""

from __future__ import annotations

import pytest

from gateway.fleet.state import FleetState
from gateway.routing import Router
from loadtests.des import DesConfig, FleetSpec, Simulation
from loadtests.des.gateways import GatewayViews
from loadtests.runner import LoadConfig
from loadtests.workloads import SharedPrefixWorkload
from loadtests.workloads.spec import RequestSpec
from policies.prefix_index import PrefixIndex
from policies.scheduling.builtin_profiles import build_builtin_profile
from policies.scheduling.profile import SchedulingProfile

pytestmark = pytest.mark.timeout(120)
INF = float("inf")
FLEET = FleetSpec(replicas=4, profile="tiny")


def specs(n: int, groups: int = 6, seed: int = 0) -> list[RequestSpec]:
    work = SharedPrefixWorkload(groups=groups, prompts_per_group=n // groups + 1, system_prompt_tokens=256,
                                question_tokens=16, output_tokens=8, model=FLEET.model_name, seed=seed)
    return list(work.requests())[:n]


def closed(concurrency: int) -> LoadConfig:
    return LoadConfig(concurrency=concurrency, duration_s=INF)


def run_until(sim: Simulation, open_requests: int) -> None:
    while len(sim.open) < open_requests and sim.step():
        pass


def test_each_gateway_counts_only_its_own_dispatches_and_learns_only_its_own_prefixes() -> None:
    sim = Simulation(DesConfig(FLEET, views=GatewayViews(gateways=2)))
    sim.begin(specs(40), closed(8))
    run_until(sim, 8)
    by_gateway = [0, 0]
    for o in sim.open.values():
        assert o.routed is not None
        by_gateway[o.routed.gateway] += 1
    assert by_gateway == [4, 4]  # round robin
    for model, own in zip(sim.gateways.models, by_gateway, strict=True):
        assert sum(r.in_flight for r in model.fleet.snapshot().replicas) == own  # not the other's
    assert sim.gateways.total_in_flight == 8 == sum(sim.gateways.in_flight)
    # A prompt gateway 0 routed is in gateway 0's index, not gateway 1's (unless 1 routed it too).
    routed = [o.routed for o in sim.open.values() if o.routed is not None]
    zero_only = {tuple(r.info.prefix_keys) for r in routed if r.gateway == 0}
    one = {tuple(r.info.prefix_keys) for r in routed if r.gateway == 1}
    names = sim.gateway.names
    for keys in zero_only - one:
        assert max(sim.gateways.models[0].router.index.match(keys, names).values(), default=0) == len(keys)
        assert sim.gateways.models[1].router.index.match(keys, names) == {}
    while sim.step():
        pass
    result = sim.finish()
    assert result.gateway_requests == (20, 20) and result.in_flight_skew.samples == 40
    assert all(m.fleet.snapshot().replicas[i].in_flight == 0 for m in sim.gateways.models for i in range(4))


def test_a_shared_ledger_gives_every_gateway_every_dispatch() -> None:
    sim = Simulation(DesConfig(FLEET, views=GatewayViews(gateways=3, ledger="shared")))
    sim.begin(specs(30), closed(9))
    run_until(sim, 9)
    for model in sim.gateways.models:
        assert [r.in_flight for r in model.fleet.snapshot().replicas] == sim.gateways.in_flight
    while sim.step():
        pass
    assert all(r.in_flight == 0 for m in sim.gateways.models for r in m.fleet.snapshot().replicas)


def test_the_des_routes_with_the_live_gateways_objects() -> None:
    sim = Simulation(DesConfig(FLEET, views=GatewayViews(gateways=2)))
    built = build_builtin_profile("default")
    for model in sim.gateways.models:
        assert type(model.router) is Router and type(model.fleet) is FleetState
        assert type(model.router.index) is PrefixIndex  # the approximate index, the router's own
        assert isinstance(model.router.profile, SchedulingProfile) and model.router.profile_name == "default"
        assert model.router.profile.picker == built.picker  # the default profile's near-best picker
        assert model.router.profile.filters == built.filters
    assert sim.gateways.models[0].router is not sim.gateways.models[1].router
    assert sim.gateways.models[0].router.index is not sim.gateways.models[1].router.index


def test_random_spread_is_seeded_and_reaches_every_gateway() -> None:
    def counts(seed: int) -> tuple[int, ...]:
        config = DesConfig(FLEET, seed=seed, views=GatewayViews(gateways=4, spread="random"))
        return Simulation(config).run(specs(80), closed(8)).gateway_requests

    first = counts(1)
    assert first == counts(1) and sum(first) == 80 and min(first) > 0
    assert first != (20, 20, 20, 20) or counts(2) != (20, 20, 20, 20)


@pytest.mark.parametrize("phases", ["independent", "aligned"])
def test_each_gateway_scrapes_on_its_own_schedule_unless_aligned(phases: str) -> None:
    views = GatewayViews(gateways=2, scrape_phases=phases)
    sim = Simulation(DesConfig(FLEET, scrape_interval_s=0.05, views=views))
    sim.begin(specs(60), closed(4))
    times: list[set[float]] = [set(), set()]
    while sim.step():
        for k, model in enumerate(sim.gateways.models):
            scraped = model.fleet.snapshot().replicas[0].scraped_at
            if scraped is not None and scraped > 0:
                times[k].add(scraped)
    assert times[0] and times[1]
    assert (times[0] == times[1]) == (phases == "aligned")


def test_a_scrape_delay_shows_the_numbers_of_delay_seconds_ago() -> None:
    delay = 0.03
    sim = Simulation(DesConfig(FLEET, scrape_interval_s=0.05, views=GatewayViews(scrape_delay_s=delay)))
    sim.begin(specs(200), closed(8))
    history: list[tuple[float, int, int]] = []  # (time, running, waiting) of replica 0's engine
    checked = 0
    last = None
    while sim.step():
        stats = sim.replicas[0].engine.stats
        history.append((sim.queue.now, stats.num_running, stats.num_waiting))
        state = sim.gateway.fleet.snapshot().replicas[0]
        if state.scraped_at is not None and state.scraped_at > 0 and state.scraped_at != last:
            last = state.scraped_at
            assert state.scraped_at == sim.queue.now
            earlier = [h for h in history if h[0] <= sim.queue.now - delay + 1e-12]
            if earlier:
                read_at = earlier[-1]
                assert (state.running, state.waiting) == read_at[1:]
                checked += 1
    assert checked >= 5


def test_views_refuse_what_does_not_exist_yet() -> None:
    with pytest.raises(ValueError, match="index"):
        GatewayViews(index="exact-ish")
    with pytest.raises(ValueError, match="event_lag_s"):
        GatewayViews(event_lag_s=float("nan"))
    with pytest.raises(ValueError, match="gateways"):
        GatewayViews(gateways=0)
    with pytest.raises(ValueError, match="spread"):
        GatewayViews(spread="sticky")
