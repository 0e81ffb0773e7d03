"""Flow control in virtual time (`DesConfig.flow_control`): the gateway's own `AdmissionQueue` holds,
releases and refuses requests as live, and nothing it held is lost or left behind."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loadtests.des import DesConfig, FleetSpec, Simulation
from loadtests.des.gateways import GatewayViews
from loadtests.runner import LoadConfig
from loadtests.workloads import RandomWorkload, SharedPrefixWorkload
from loadtests.workloads.spec import RequestSpec
from simulator.engine import EngineConfig

pytestmark = pytest.mark.timeout(120)
INF = float("inf")
TINY = FleetSpec(replicas=1, profile="tiny")
MODEL = TINY.model_name


def closed(concurrency: int, request_timeout_s: float = 300.0) -> LoadConfig:
    return LoadConfig(concurrency=concurrency, duration_s=INF, request_timeout_s=request_timeout_s)


def counted(max_in_flight: int, **bands: float) -> dict[str, Any]:
    """A gateway config whose flow control counts requests only (the latency gate off)."""
    flow: dict[str, Any] = {
        "predicted_admission": False,
        "saturation": {"max_in_flight_per_replica": max_in_flight, "max_waiting_per_replica": 64},
        "fair_share": {"reserve_per_replica": 0},
    }
    if bands:
        flow["bands"] = {name: {"max_wait_s": wait} for name, wait in bands.items()}
    return {"flow_control": flow}


def assert_nothing_left(sim: Simulation) -> None:
    for gw in sim.gateways.models:
        adm = gw.admission
        assert adm is not None
        assert adm.depth == 0 and adm.depth_in(MODEL) == 0
        assert all(p.pending == 0 for p in adm._pools)  # every release was dispatched or passed on
        assert sum(p.share.in_flight_of(t) for p in adm._pools for t in ("anonymous", "a", "b")) == 0
        assert gw.fleet.snapshot().replicas[0].in_flight == 0


def test_a_saturated_replica_gets_no_more_than_its_slots_and_the_rest_wait_at_the_gateway() -> None:
    work = RandomWorkload(requests=40, prompt_tokens=64, output_tokens=16, model=MODEL, seed=3)
    engine_load: dict[bool, int] = {}
    ttft: dict[bool, float] = {}
    for flow in (False, True):
        sim = Simulation(DesConfig(TINY, gateway=counted(2), flow_control=flow))
        sim.begin(work.requests(), closed(6))
        peak = 0
        while sim.step():
            engine = sim.replicas[0].engine
            peak = max(peak, engine.stats.num_running + engine.stats.num_waiting)
        result = sim.finish()
        assert len(result.traces) == 40 and all(t.ok for t in result.traces)
        engine_load[flow] = peak
        ttft[flow] = max(t.ttft or 0.0 for t in result.traces)
        figures = result.des_figures()
        assert figures["flow_control"] is flow
        if flow:
            assert_nothing_left(sim)
            waits = figures["gateway_wait_s"]
            assert waits["n"] == 40 and 0 < waits["held"] < 40 and waits["p90"] > 0
    assert engine_load == {False: 6, True: 2}
    # The time a request waited at the gateway is in its TTFT, as a client sees it.
    assert ttft[True] > 0


def test_a_band_with_no_wait_is_refused_at_once_and_a_waiter_gets_503_at_its_max_wait() -> None:
    long = RandomWorkload(requests=12, prompt_tokens=64, output_tokens=400, model=MODEL, seed=1)
    specs = list(long.requests())
    shed = [replace(s, headers={"x-kvgate-priority": "sheddable"}) for s in specs[6:]]
    sim = Simulation(DesConfig(TINY, gateway=counted(2, standard=0.05), flow_control=True))
    result = sim.run(specs[:6] + shed, closed(6))
    by_status: dict[int, list[Any]] = {}
    for t in result.traces:
        by_status.setdefault(t.status, []).append(t)
    ok, refused = by_status.pop(200), by_status.pop(503)
    assert not by_status and len(ok) + len(refused) == 12
    waited_out = [t for t in refused if t.request_id in {s.request_id for s in specs[:6]}]
    at_once = [t for t in refused if t not in waited_out]
    # The first two standard requests run (400 tokens: far longer than 0.05 s); the other four
    # wait 0.05 s for a slot that does not come, and every sheddable one is refused on arrival.
    assert len(waited_out) == 4 and all(t.end - t.start == pytest.approx(0.05) for t in waited_out)
    assert at_once and all(t.end == t.start for t in at_once)
    assert all(t.error is not None and "overloaded" in t.error for t in refused)
    assert_nothing_left(sim)


def test_a_client_that_gives_up_while_waiting_leaves_the_queue() -> None:
    work = RandomWorkload(requests=8, prompt_tokens=64, output_tokens=400, model=MODEL, seed=1)
    sim = Simulation(DesConfig(TINY, gateway=counted(1), flow_control=True))
    result = sim.run(work.requests(), closed(4, request_timeout_s=0.05))
    assert len(result.traces) == 8
    assert all(t.error is not None and t.error.startswith("timeout") for t in result.traces)
    assert all(t.end == pytest.approx(t.start + 0.05) for t in result.traces)
    # Only one request at a time ever reached the engine; the others left the queue unanswered.
    assert sum(1 for t in result.traces if t.replica is not None) == 2
    assert_nothing_left(sim)


def test_the_latency_gate_holds_a_flood_at_the_gateway_and_loses_nothing() -> None:
    # The gate on (kvgate's default), far more streams than the knee: requests queue at the gateway
    # and are released at finishes, first tokens and scrapes, and now and then inside the very
    # `admit` that queued them (the queue's drain after the push). Every request ends with its
    # answer, and nothing stays counted once the point is over.
    fleet = FleetSpec(replicas=2, profile="llama-3-8b-h100")
    woken_inside: list[int] = []
    for concurrency, seed in ((32, 1), (32, 2), (48, 0)):
        work = SharedPrefixWorkload(groups=6, prompts_per_group=40, system_prompt_tokens=2048,
                                    question_tokens=128, output_tokens=8, model=fleet.model_name,
                                    seed=seed)  # fmt: skip
        sim = Simulation(DesConfig(fleet, flow_control=True, seed=seed))
        adm = sim.gateway.admission
        assert adm is not None
        admit = adm.admit

        def counting_admit(*args: Any, admit: Any = admit) -> Any:
            *rest, wake = args
            returned = False

            def counted_wake(err: Any) -> bool:
                if not returned:
                    woken_inside.append(1)  # woken before `admit` returned
                return bool(wake(err))

            try:
                return admit(*rest, counted_wake)
            finally:
                returned = True

        adm.admit = counting_admit  # type: ignore[method-assign, assignment]
        sim.begin(work.requests(), closed(concurrency))
        held = 0
        while sim.step():
            held = max(held, adm.depth)
        result = sim.finish()
        assert held > 0
        assert len(result.traces) == 240 and all(t.ok for t in result.traces), {
            t.error for t in result.traces
        }
        assert_nothing_left(sim)
    assert woken_inside, "no release inside admit in these runs: pick runs that have one"


def test_without_flow_control_the_gateway_has_no_queue() -> None:
    sim = Simulation(DesConfig(TINY))
    assert sim.gateway.admission is None
    spec = RequestSpec(request_id="q", endpoint="completions",
                       body={"model": MODEL, "prompt": "Hi there.", "max_tokens": 3})  # fmt: skip
    assert sim.run([spec], closed(1)).traces[0].ok


@pytest.mark.parametrize("ledger", ["local", "shared"])
def test_each_gateway_admits_through_its_own_queue(ledger: str) -> None:
    # Two gateway processes, each with its own admission queue over its own picture of the fleet (a
    # shared ledger also tells each one of the other's finishes: capacity events for its queue).
    fleet = FleetSpec(replicas=2, profile="tiny")
    work = RandomWorkload(requests=60, prompt_tokens=64, output_tokens=16, model=MODEL, seed=4)
    views = GatewayViews(gateways=2, ledger=ledger)
    sim = Simulation(DesConfig(fleet, gateway=counted(1), flow_control=True, views=views))
    sim.begin(work.requests(), closed(8))
    held = [0, 0]
    while sim.step():
        for k, gw in enumerate(sim.gateways.models):
            assert gw.admission is not None
            held[k] = max(held[k], gw.admission.depth)
    result = sim.finish()
    assert len(result.traces) == 60 and all(t.ok for t in result.traces)
    assert min(held) > 0  # both queued: each counts only its own slots (1 per replica)
    assert list(result.gateway_requests) == [30, 30]
    for gw in sim.gateways.models:
        adm = gw.admission
        assert adm is not None and adm.depth == 0 and all(p.pending == 0 for p in adm._pools)
        assert all(r.in_flight == 0 for r in gw.fleet.snapshot().replicas)


def test_a_malformed_priority_or_slo_header_is_answered_400_as_live() -> None:
    body = {"model": MODEL, "prompt": "Hi there.", "max_tokens": 3}
    specs = [
        RequestSpec(
            request_id="p", endpoint="completions", body=body, headers={"x-kvgate-priority": "urgent"}
        ),
        RequestSpec(
            request_id="s", endpoint="completions", body=body, headers={"x-kvgate-ttft-slo-ms": "-5"}
        ),
        RequestSpec(
            request_id="ok", endpoint="completions", body=body, headers={"x-kvgate-ttft-slo-ms": "250"}
        ),
    ]
    sim = Simulation(DesConfig(TINY, flow_control=True))
    by_id = {t.request_id: t for t in sim.run(specs, closed(1)).traces}
    assert by_id["p"].status == 400 and "x-kvgate-priority" in (by_id["p"].error or "")
    assert by_id["s"].status == 400 and "x-kvgate-ttft-slo-ms" in (by_id["s"].error or "")
    assert by_id["ok"].ok
    assert_nothing_left(sim)


def test_short_prompts_at_low_load_are_not_held_for_the_step_under_way() -> None:
    # Two streams per replica of 256-token prompts on llama-3-8b-h100 replicas, the latency gate on as
    # kvgate ships: a prompt's unloaded TTFT is about one decode step, so a replica running anything
    # was past the knee while a step was under way, and the gate held 141-198 of these 200 requests
    # for 48-98 ms (median), TTFT p90 0.27-0.31 s. The knee now allows the decode step under way.
    fleet = FleetSpec(replicas=2, profile="llama-3-8b-h100")
    work = RandomWorkload(requests=200, prompt_tokens=256, output_tokens=128, model=fleet.model_name, seed=0)
    result = Simulation(DesConfig(fleet, flow_control=True)).run(list(work.requests()), closed(4))
    assert len(result.traces) == 200 and all(t.ok for t in result.traces)
    waits = result.des_figures()["gateway_wait_s"]
    assert waits["held"] <= 20, waits
    ttfts = sorted(t.ttft for t in result.traces if t.ttft is not None)
    assert ttfts[int(0.9 * len(ttfts))] < 0.05  # about two steps, not a hold


def test_a_hot_prefix_takes_every_replica_under_predicted_latency() -> None:
    # Two 4,096-token system prompts over 4 replicas, 4 streams per replica, as kvgate ships (gate on):
    # `predicted-latency` priced each request alone, so every request went where its prefix was held
    # and two replicas served nothing (docs/benchmarks.md, "Hot prefixes"). `prefix-spread` warms a
    # copy once a group crowds its replica.
    fleet = FleetSpec(replicas=4, profile="llama-3-8b-h100", engine=EngineConfig(num_gpu_blocks=2048))
    work = SharedPrefixWorkload(
        groups=2, prompts_per_group=100, system_prompt_tokens=4096, question_tokens=256, output_tokens=64,
        model=fleet.model_name, seed=0,
    )  # fmt: skip
    result = Simulation(DesConfig(fleet, policy="predicted-latency", flow_control=True)).run(
        list(work.requests()), closed(16)
    )
    assert len(result.traces) == 200 and all(t.ok for t in result.traces)
    served = [r.requests for r in result.replicas]
    assert min(served) >= 20, served  # without the filter: [~100, ~100, 0, 0]
    assert result.des_figures()["replica_hit_rate_min"] > 0.85  # each copy is warmed once, then used
