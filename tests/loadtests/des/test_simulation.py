"""The simulation's behaviour, in virtual time: no sleeping, no HTTP."""

from __future__ import annotations

import gc
import itertools
from collections import defaultdict
from dataclasses import replace

import pytest

from loadtests.des import DesConfig, FleetSpec, Simulation, run_des
from loadtests.des.arrivals import LoadClients
from loadtests.runner import LoadConfig
from loadtests.workloads import RandomWorkload, SharedPrefixWorkload
from loadtests.workloads.spec import RequestSpec, chat_body
from simulator.engine import Engine, EngineConfig, EngineRequest
from simulator.profiles import get_profile
from simulator.tokenizer import encode, render_chat
from tests.simulator.engine_run import run as run_engine

pytestmark = pytest.mark.timeout(120)
INF = float("inf")
TINY = FleetSpec(replicas=1, profile="tiny")
MODEL = TINY.model_name


def closed(concurrency: int, max_requests: int | None = None, request_timeout_s: float = 300.0) -> LoadConfig:
    return LoadConfig(concurrency=concurrency, duration_s=INF, max_requests=max_requests,
                      request_timeout_s=request_timeout_s)


def test_one_request_on_one_replica_has_the_engines_own_ttft_and_token_times() -> None:
    body = chat_body(MODEL, "You answer briefly. " * 40, "What is a KV cache?", max_tokens=5)
    spec = RequestSpec(request_id="q", endpoint="chat", body=body)
    result = run_des([spec], DesConfig(TINY), closed(1))

    ids = encode(render_chat(body["messages"]))
    engine = Engine(get_profile("tiny"))
    direct = run_engine(engine, arrivals=[(0.0, EngineRequest("q", ids, 5))])
    finished = direct.finished["q"]
    token_times = [s.end for s in direct.steps if any(t.request_id == "q" for t in s.tokens)]

    (trace,) = result.traces
    assert trace.ok and trace.start == 0.0
    assert trace.first_token == finished.first_token  # exactly: the same engine, the same calls
    assert trace.end == finished.finished and trace.chunk_times == token_times
    assert (trace.prompt_tokens, trace.output_tokens) == (len(ids), 5)


def test_gateway_overhead_shifts_every_time_by_the_same_amount() -> None:
    body = chat_body(MODEL, None, "Hello there.", max_tokens=3)
    spec = RequestSpec(request_id="q", endpoint="chat", body=body)
    plain = run_des([spec], DesConfig(TINY), closed(1)).traces[0]
    slow = run_des([spec], DesConfig(TINY, gateway_overhead_s=0.004), closed(1)).traces[0]
    assert plain.ttft is not None and slow.ttft == pytest.approx(plain.ttft + 0.004)
    assert slow.e2e == pytest.approx(plain.e2e + 0.004)


def test_closed_loop_holds_exactly_its_concurrency_in_flight() -> None:
    work = RandomWorkload(requests=60, prompt_tokens=64, output_tokens=8, model=MODEL, seed=2)
    sim = Simulation(DesConfig(replace(TINY, replicas=2)))
    sim.begin(work.requests(), closed(5))
    seen = set()
    while sim.step():
        seen.add(len(sim.open))
    result = sim.finish()
    assert max(seen) == 5 and len(result.traces) == 60 and all(t.ok for t in result.traces)
    # From the traces alone: at no instant more than 5 requests between start and end.
    edges = sorted([(t.end, -1) for t in result.traces] + [(t.start, 1) for t in result.traces])
    level = peak = 0
    for _, delta in edges:
        level += delta
        peak = max(peak, level)
    assert peak == 5


def sized_shared_prefix(seed: int = 1) -> SharedPrefixWorkload:
    kv = get_profile("tiny").kv_capacity_tokens()
    return SharedPrefixWorkload.sized(replica_kv_tokens=kv, replicas=8, prompts_per_group=5,
                                      system_prompt_tokens=512, question_tokens=32, output_tokens=4,
                                      model=MODEL, seed=seed)


def test_prefix_affinity_keeps_a_group_on_one_replica_where_round_robin_spreads_it() -> None:
    work = sized_shared_prefix()
    assert work.sizing is not None and work.sizing.multiple_of_replica >= 3  # cache-blind cannot hold them
    spread: dict[str, float] = {}
    hit_rate: dict[str, float] = {}
    for policy in ("default", "round-robin"):
        result = run_des(work.requests(), DesConfig(replace(TINY, replicas=8), policy=policy), closed(8))
        assert len(result.traces) == work.size() and all(t.ok for t in result.traces)
        replicas_of: dict[str | None, set[str | None]] = defaultdict(set)
        for t in result.traces:
            replicas_of[t.group].add(t.replica)
        spread[policy] = sum(len(r) for r in replicas_of.values()) / len(replicas_of)
        assert result.fleet.prefix_hit_rate is not None
        hit_rate[policy] = result.fleet.prefix_hit_rate
    assert spread["default"] < 1.5 < 3 < spread["round-robin"], spread
    assert hit_rate["default"] > hit_rate["round-robin"] + 0.25, hit_rate


def test_the_gateways_picture_changes_only_at_scrapes_except_its_own_in_flight_counts() -> None:
    # One replica that runs at most 2 sequences: with 6 clients, 4 wait in its engine queue.
    fleet = FleetSpec(replicas=1, profile="tiny", engine=EngineConfig(max_num_seqs=2))
    work = RandomWorkload(requests=40, prompt_tokens=64, output_tokens=16, model=MODEL, seed=3)
    sim = Simulation(DesConfig(fleet, scrape_interval_s=0.05))
    sim.begin(work.requests(), closed(6))
    last = sim.gateway.fleet.snapshot().replicas[0]
    scrape_times = set()
    stale_seen = in_flight_moved_between_scrapes = False
    while sim.step():
        now = sim.queue.now
        state = sim.gateway.fleet.snapshot().replicas[0]
        engine = sim.replicas[0].engine.stats
        if state.scraped_at != last.scraped_at:
            assert state.scraped_at == now  # a scrape happened at this very event
            scrape_times.add(now)
            assert (state.running, state.waiting) == (engine.num_running, engine.num_waiting)
        else:
            assert (state.running, state.waiting, state.kv_usage) == (last.running, last.waiting,
                                                                     last.kv_usage)
            stale_seen |= state.waiting != engine.num_waiting
            in_flight_moved_between_scrapes |= state.in_flight != last.in_flight
        last = state
    assert stale_seen and in_flight_moved_between_scrapes
    gaps = sorted(scrape_times)
    assert all(0.045 - 1e-9 <= b - a <= 0.055 + 1e-9 for a, b in itertools.pairwise(gaps))


def test_same_seed_same_traces() -> None:
    work = sized_shared_prefix(seed=4)
    config = DesConfig(replace(TINY, replicas=4), seed=9)
    load = LoadConfig(rate=200.0, burstiness=0.5, duration_s=INF, seed=2)
    a, b = run_des(work.requests(), config, load), run_des(work.requests(), config, load)
    assert a.traces == b.traces and a.fleet == b.fleet and a.events == b.events
    assert len({t.replica for t in a.traces}) == 4


def test_open_loop_arrivals_start_at_the_live_runners_times() -> None:
    work = RandomWorkload(requests=30, prompt_tokens=32, output_tokens=4, model=MODEL, seed=1)
    load = LoadConfig(rate=100.0, duration_s=INF, seed=5)
    result = run_des(work.requests(), DesConfig(replace(TINY, replicas=2)), load)
    clients = LoadClients(work.requests(), load)
    expected = []
    while clients.next_arrival is not None:
        expected += [t for _, t in clients.arrive(clients.next_arrival)]
    assert sorted(t.start for t in result.traces) == expected


def test_timeouts_fail_the_request_and_free_the_replica() -> None:
    work = RandomWorkload(requests=4, prompt_tokens=64, output_tokens=500, model=MODEL, seed=1)
    result = run_des(work.requests(), DesConfig(TINY), closed(2, request_timeout_s=0.05))
    assert len(result.traces) == 4
    assert all(t.error is not None and t.error.startswith("timeout") for t in result.traces)
    assert all(t.status == 200 and t.end == pytest.approx(t.start + 0.05) for t in result.traces)


def test_the_drain_deadline_cuts_what_still_runs() -> None:
    work = RandomWorkload(requests=50, prompt_tokens=64, output_tokens=50, model=MODEL, seed=1)
    result = run_des(work.requests(), DesConfig(TINY),
                     LoadConfig(concurrency=4, duration_s=0.15, drain_timeout_s=0.01))
    # Each request takes ~0.1 s: the second round starts before 0.15 s and cannot end by 0.16 s.
    assert result.incomplete == 4 and result.sent == len(result.traces) + result.incomplete
    assert all(t.start < 0.15 and t.end <= 0.16 for t in result.traces)


def test_errors_come_back_as_the_replica_or_gateway_would_answer() -> None:
    bad_model = RequestSpec(request_id="m", endpoint="chat", body=chat_body("nope", None, "Hi.", 4))
    too_long = RequestSpec(request_id="l", endpoint="chat", body=chat_body(MODEL, None, "Hi.", 10**6))
    ok = RequestSpec(request_id="k", endpoint="chat", body=chat_body(MODEL, None, "Hi.", 4))
    sim = Simulation(DesConfig(TINY))
    result = sim.run([bad_model, too_long, ok], closed(1))
    by_id = {t.request_id: t for t in result.traces}
    assert sim.gateway.fleet.snapshot().replicas[0].in_flight == 0  # failures released their count
    assert by_id["m"].status == 404 and by_id["l"].status == 400 and by_id["k"].ok
    assert by_id["l"].replica == "r0" and by_id["m"].replica is None


def test_eight_replicas_two_thousand_requests() -> None:
    work = RandomWorkload(requests=2_000, prompt_tokens=48, output_tokens=8, model=MODEL, seed=7)
    thresholds = gc.get_threshold()
    result = run_des(work.requests(), DesConfig(replace(TINY, replicas=8)), closed(64))
    assert gc.get_threshold() == thresholds  # the run's GC setting is undone
    assert len(result.traces) == 2_000 and all(t.ok for t in result.traces)
    assert {r.name for r in result.replicas} == {f"r{i}" for i in range(8)}
    assert sum(r.requests for r in result.replicas) == 2_000
    assert result.events > 2_000 and result.virtual_s > 0


def test_consecutive_load_points_share_the_fleet_and_count_their_own_increases() -> None:
    work = sized_shared_prefix(seed=6)
    specs = list(work.requests())
    sim = Simulation(DesConfig(replace(TINY, replicas=8)))
    first = sim.run(specs[:160], LoadConfig(concurrency=8, duration_s=5.0, drain_timeout_s=5.0))
    t1 = sim.queue.now
    second = sim.run(specs[160:], LoadConfig(concurrency=8, duration_s=INF, warmup_s=0.01))
    cold = run_des(specs[160:], DesConfig(replace(TINY, replicas=8)), closed(8))
    assert min(t.start for t in second.traces) == t1 and second.warmup_end == t1 + 0.01
    assert first.sent + second.sent == len(specs) and second.incomplete == 0
    assert sum(r.requests for r in second.replicas) == len(specs) - 160
    for point in (first, second):  # each point's lookups are its own requests' prompts
        assert point.fleet.prefix_queries == sum(t.prompt_tokens or 0 for t in point.traces)
    assert second.fleet.prefix_hit_rate is not None and cold.fleet.prefix_hit_rate is not None
    assert second.fleet.prefix_hit_rate > cold.fleet.prefix_hit_rate  # the first point warmed the caches
    assert second.virtual_s == pytest.approx(sim.queue.now - t1)


def test_a_drained_point_leaves_nothing_behind_for_the_next() -> None:
    first = RandomWorkload(requests=400, prompt_tokens=64, output_tokens=40, model=MODEL, seed=1)
    second = RandomWorkload(requests=20, prompt_tokens=64, output_tokens=40, model=MODEL, seed=2)
    sim = Simulation(DesConfig(replace(TINY, replicas=2)))
    cut = sim.run(first.requests(), LoadConfig(rate=2000.0, duration_s=0.05, drain_timeout_s=0.001,
                                               request_timeout_s=0.2))
    assert cut.incomplete > 0
    after = sim.run([replace(s, request_id="next-" + s.request_id) for s in second.requests()], closed(4))
    assert len(after.traces) == 20 and all(t.ok and t.request_id.startswith("next-") for t in after.traces)
    assert after.incomplete == 0 and sum(r.requests for r in after.replicas) == 20
    # The first point's timeouts (0.2 s after its sends) fall inside the second point: none fires there.
    assert after.virtual_s > 0.3 and all(t.error is None for t in after.traces)


def test_ended_requests_deadlines_do_not_pile_up() -> None:
    work = RandomWorkload(requests=3_000, prompt_tokens=16, output_tokens=2, model=MODEL, seed=3)
    sim = Simulation(DesConfig(replace(TINY, replicas=2)))
    sim.begin(work.requests(), closed(8))  # a 300 s timeout: no deadline passes during the run
    largest = 0
    while sim.step():
        largest = max(largest, len(sim._require().timeouts))
    assert len(sim.finish().traces) == 3_000
    assert largest <= 2 * 8 + 1024 + 1


def test_the_ttft_prediction_error_scores_the_measured_requests_alone() -> None:
    # The point's start (every closed-loop client sending at once) is a transient the warm-up is
    # for: the model's error is over the requests the other measures count, not those before.
    specs = list(sized_shared_prefix(seed=3).requests())[:120]
    config = DesConfig(replace(TINY, replicas=2))
    whole = run_des(specs, config, closed(8))
    t0 = min(t.start for t in whole.traces)
    cut = sorted(t.start for t in whole.traces)[40]  # a third of the requests start before it
    warm = run_des(specs, config, replace(closed(8), warmup_s=cut - t0))

    def scored(result):  # requests that got a first token after the warm-up: each scored once
        return sum(1 for t in result.traces if t.first_token is not None and t.start >= result.warmup_end)

    assert [t.first_token for t in warm.traces] == [t.first_token for t in whole.traces]  # same run
    n_whole = whole.extra["ttft_prediction_error"]["n"]
    n_warm = warm.extra["ttft_prediction_error"]["n"]
    assert n_whole == scored(whole) == len(specs)
    assert n_warm == scored(warm) and 0 < n_warm <= len(specs) - 40
