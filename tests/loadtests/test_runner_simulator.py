"""The load generator against the replica simulator over real loopback HTTP: the path the benchmark
takes, with real SSE framing, real usage and real `/metrics` counters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from loadtests import noisy_bench
from loadtests.measures import fleet_delta
from loadtests.runner import LoadConfig, open_session, run_load, scrape_counters
from loadtests.workloads import MultiTurnWorkload, RandomWorkload, SharedPrefixWorkload
from simulator.fleet import SimFleet
from simulator.server.faults import FaultConfig

pytestmark = pytest.mark.timeout(60)
MODEL = "tiny-llama"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(replicas=1, profile="tiny", time_scale=1.0) as f:
        yield f


async def test_random_workload_counts_tokens_and_usage(fleet: SimFleet) -> None:
    url = fleet.urls[0]
    work = RandomWorkload(requests=12, prompt_tokens=64, output_tokens=8, model=MODEL, seed=1)
    run = await run_load(url, work.requests(), LoadConfig(concurrency=4, duration_s=30))
    assert run.sent == 12 and len(run.traces) == 12
    for t in run.traces:
        assert t.ok, t.error
        assert t.output_tokens == 8 and len(t.chunk_times) == 8
        assert t.prompt_tokens is not None and t.prompt_tokens >= 64
        assert t.first_token is not None and t.start < t.first_token <= t.end
    m = run.summarize()
    assert m.completed == 12 and m.ttft.p90 is not None and m.tpot.p90 is not None and m.itl.count == 12 * 7


async def test_shared_prefix_hits_seen_by_counters_and_usage(fleet: SimFleet) -> None:
    urls = fleet.urls
    work = SharedPrefixWorkload(
        groups=3,
        prompts_per_group=6,
        system_prompt_tokens=256,
        question_tokens=32,
        output_tokens=4,
        model=MODEL,
    )
    async with open_session(4) as session:
        before = await scrape_counters(session, urls)
        run = await run_load(urls[0], work.requests(), LoadConfig(concurrency=2), session=session)
        after = await scrape_counters(session, urls)
    delta = fleet_delta(before, after)
    assert delta.prefix_queries > 0
    hit_rate = delta.prefix_hit_rate
    # Each group's prefix is prefilled once, then hit by its other 5 prompts (whole blocks only).
    assert hit_rate is not None and 0.5 < hit_rate < 0.9
    measured = run.summarize().cached_token_fraction
    assert measured == pytest.approx(hit_rate, abs=0.02)


async def test_multi_turn_sessions_through_the_simulator(fleet: SimFleet) -> None:
    url = fleet.urls[0]
    work = MultiTurnWorkload(
        conversations=3, turns=4, system_prompt_tokens=64, user_tokens=16, output_tokens=8, model=MODEL
    )
    run = await run_load(url, work.requests(), LoadConfig(concurrency=3, duration_s=30))
    assert len(run.traces) == 12 and all(t.ok for t in run.traces)
    by_conv: dict[str, list[int]] = {}
    for t in sorted(run.traces, key=lambda t: t.start):
        by_conv.setdefault(t.group or "", []).append(t.prompt_tokens or 0)
    for prompts in by_conv.values():
        assert prompts == sorted(prompts) and len(set(prompts)) == 4  # history grows turn by turn
    later = [t for t in run.traces if not t.request_id.endswith("-1")]
    assert all((t.cached_tokens or 0) > 0 for t in later)  # each turn reuses the previous prompt


async def test_simulator_faults_are_counted() -> None:
    faults = [
        FaultConfig(crash_after_chunks=3),
        FaultConfig(error_rate=1.0, error_status=503),
        FaultConfig(hang_after_chunks=2),
    ]
    async with SimFleet(replicas=3, profile="tiny", faults=faults) as f:
        work = list(RandomWorkload(requests=2, prompt_tokens=16, output_tokens=8, model=MODEL).requests())
        config = LoadConfig(concurrency=2, duration_s=30, request_timeout_s=0.5)
        crashed, refused, hung = [await run_load(url, work, config) for url in f.urls]
    assert all(t.error and t.error.startswith("connection:") for t in crashed.traces)
    assert refused.summarize().status_503 == 2 and refused.summarize().error_kinds == {"http": 2}
    assert all(t.error and t.error.startswith("timeout:") for t in hung.traces)


async def test_bounded_by_wall_time_against_the_simulator(fleet: SimFleet) -> None:
    url = fleet.urls[0]
    work = RandomWorkload(requests=100_000, prompt_tokens=16, output_tokens=16, model=MODEL)
    config = LoadConfig(concurrency=4, duration_s=0.5, drain_timeout_s=10)
    run = await run_load(url, work.requests(), config)
    assert 0 < run.sent < 100_000 and len(run.traces) == run.sent
    assert max(t.start for t in run.traces) <= run.started + config.duration_s


async def test_non_streaming_answers_are_read_whole(fleet: SimFleet) -> None:
    work = noisy_bench.workload(6, seed=2, prompt_tokens=64, stream=False)
    assert all(s.body["stream"] is False and "stream_options" not in s.body for s in work)
    work = [replace(s, body={**s.body, "model": MODEL}) for s in work]
    run = await run_load(fleet.urls[0], work, LoadConfig(concurrency=3, duration_s=30))
    assert len(run.traces) == 6
    for t in run.traces:
        assert t.ok, t.error
        assert t.first_token is None and t.chunk_times == []  # no first token to time
        assert t.output_tokens == 64 and t.prompt_tokens is not None and t.prompt_tokens >= 64
