"""The load generator over real loopback HTTP against a small streaming server (see fake_openai.py)."""

from __future__ import annotations

import random
import socket
import statistics
from collections.abc import AsyncIterator, Iterator

import pytest

from loadtests.runner import (
    LoadConfig,
    inter_arrival_gaps,
    open_session,
    run_load,
    run_load_in_thread,
    scrape_counters,
)
from loadtests.workloads.random_prompts import RandomWorkload
from loadtests.workloads.spec import Endpoint, RequestSpec, request_body
from tests.loadtests.fake_openai import FIRST_TOKEN_DELAY_S, REPLICA_NAME, FakeState, serve_fake

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def state() -> FakeState:
    return FakeState()


@pytest.fixture
async def url(state: FakeState) -> AsyncIterator[str]:
    async with serve_fake(state) as base:
        yield base


def specs(
    n: int,
    model: str = "m",
    *,
    endpoint: Endpoint = "chat",
    max_tokens: int = 5,
    session: str | None = None,
    tenant: str | None = None,
    prefix: str = "r",
) -> Iterator[RequestSpec]:
    for i in range(n):
        yield RequestSpec(
            request_id=f"{prefix}{i}",
            endpoint=endpoint,
            body=request_body(endpoint, model, None, f"hello {i}", max_tokens),
            tenant=tenant,
            api_key=f"sk-{tenant}" if tenant else None,
            session_id=session,
            headers={"x-test-id": f"{prefix}{i}"},
        )


async def test_closed_loop_sends_every_request_and_parses_streams(url: str, state: FakeState) -> None:
    run = await run_load(url, specs(40, max_tokens=6), LoadConfig(concurrency=4, duration_s=30))

    assert run.sent == 40 and len(run.traces) == 40 and run.incomplete == 0
    for t in run.traces:
        assert t.ok, t.error
        assert t.status == 200
        assert len(t.chunk_times) == 6  # the role chunk carries no content and is not counted
        assert t.first_token == t.chunk_times[0]
        assert t.output_tokens == 6 and t.prompt_tokens == 7 and t.cached_tokens == 3
        assert t.replica == REPLICA_NAME
        assert t.start <= t.first_token <= t.end
    assert sorted(t.request_id for t in run.traces) == sorted(f"r{i}" for i in range(40))
    assert all(b["stream"] is True for b in state.bodies)


async def test_completions_endpoint_and_crlf_framing(url: str) -> None:
    run = await run_load(
        url,
        [*specs(3, endpoint="completions", prefix="c"), *specs(3, "crlf", prefix="x")],
        LoadConfig(concurrency=2, duration_s=30),
    )
    assert len(run.traces) == 6
    assert all(t.ok and len(t.chunk_times) == 5 and t.output_tokens == 5 for t in run.traces)


async def test_first_token_is_the_first_content_chunk_not_the_role_chunk(url: str) -> None:
    run = await run_load(url, specs(2, "late-first"), LoadConfig(concurrency=1, duration_s=30))
    for t in run.traces:
        assert t.ok
        assert t.ttft is not None and t.ttft >= FIRST_TOKEN_DELAY_S


async def test_errors_are_counted_by_kind(url: str) -> None:
    work = [
        *specs(2, "overloaded", prefix="o"),
        *specs(1, "unavailable", prefix="u"),
        *specs(2, "broken", prefix="b"),
        *specs(1, "error-event", prefix="e"),
        *specs(1, "no-done", prefix="n"),
        *specs(2, prefix="ok"),
    ]
    run = await run_load(url, work, LoadConfig(concurrency=3, duration_s=30))
    by_id = {t.request_id: t for t in run.traces}
    assert len(by_id) == 9

    assert by_id["o0"].status == 429 and by_id["o0"].error == "http: 429 overloaded!"
    assert by_id["u0"].status == 503 and by_id["u0"].error is not None
    assert by_id["b0"].error is not None and by_id["b0"].error.startswith("connection:")
    assert len(by_id["b0"].chunk_times) == 2  # what came before the break is kept
    assert by_id["e0"].error == "stream-error: engine died" and by_id["e0"].status == 200
    assert by_id["n0"].error is not None and by_id["n0"].error.startswith("incomplete:")
    assert by_id["ok0"].ok and by_id["ok1"].ok

    m = run.summarize()
    assert m.requests == 9 and m.completed == 2 and m.errors == 7
    assert m.status_429 == 2 and m.status_503 == 1
    assert m.error_kinds == {"connection": 2, "http": 3, "incomplete": 1, "stream-error": 1}


async def test_request_timeout_is_an_error(url: str) -> None:
    config = LoadConfig(concurrency=1, duration_s=30, request_timeout_s=0.3)
    run = await run_load(url, specs(1, "hang"), config)
    (t,) = run.traces
    assert t.error is not None and t.error.startswith("timeout:")
    assert t.first_token is None


async def test_bounded_by_count(url: str) -> None:
    run = await run_load(url, specs(100), LoadConfig(concurrency=5, duration_s=30, max_requests=12))
    assert run.sent == 12 and len(run.traces) == 12


async def test_bounded_by_wall_time(url: str, state: FakeState) -> None:
    state.chunk_delay_s = 0.01
    config = LoadConfig(concurrency=2, duration_s=0.3, drain_timeout_s=10)
    run = await run_load(url, specs(10_000), config)
    assert 0 < run.sent < 10_000
    assert len(run.traces) == run.sent and run.incomplete == 0
    assert max(t.start for t in run.traces) <= run.started + config.duration_s


async def test_drain_deadline_cancels_hung_requests(url: str) -> None:
    config = LoadConfig(concurrency=3, duration_s=0.2, drain_timeout_s=0.2)
    run = await run_load(url, specs(10, "hang"), config)
    assert run.sent == 3 and run.incomplete == 3 and run.traces == []


async def test_sessions_are_sequential_and_conversations_concurrent(url: str, state: FakeState) -> None:
    state.chunk_delay_s = 0.002
    work: list[RequestSpec] = []
    for turn in range(4):
        for conv in ("a", "b", "c"):
            (spec,) = specs(1, session=conv, prefix=f"{conv}{turn}-")
            work.append(spec)
    run = await run_load(url, work, LoadConfig(concurrency=3, duration_s=30))
    assert len(run.traces) == 12 and all(t.ok for t in run.traces)

    for conv in ("a", "b", "c"):
        events = [(kind, rid) for kind, rid, _ in state.log if rid.startswith(conv)]
        expected = [(kind, f"{conv}{turn}-0") for turn in range(4) for kind in ("start", "end")]
        assert events == expected  # each turn ends before the next starts, in order
    starts = [rid for kind, rid, _ in state.log if kind == "start"]
    assert set(starts[:3]) == {"a0-0", "b0-0", "c0-0"}  # different sessions overlap


async def test_headers_tenant_key_and_connection_reuse(url: str, state: FakeState) -> None:
    config = LoadConfig(concurrency=4, duration_s=30, headers={"x-extra": "1"})
    run = await run_load(url, specs(50, tenant="acme"), config)
    assert len(run.traces) == 50 and all(t.tenant == "acme" for t in run.traces)
    assert all(h["authorization"] == "Bearer sk-acme" and h["x-extra"] == "1" for h in state.headers)
    # Each request carries its spec's id (a gateway's access log keeps it).
    assert sorted(h["x-request-id"] for h in state.headers) == sorted(f"r{i}" for i in range(50))
    ports = {port for _, _, port in state.log}
    assert len(ports) <= 4  # keep-alive: one connection per worker, not one per request


async def test_open_loop_poisson_and_bursty(url: str) -> None:
    for burstiness in (1.0, 0.3):
        config = LoadConfig(rate=400.0, burstiness=burstiness, duration_s=30, max_requests=25)
        run = await run_load(url, specs(100), config)
        assert run.sent == 25 and len(run.traces) == 25 and all(t.ok for t in run.traces)
        record = run.to_record(policy="direct", workload="random")
        assert record.mode == "open" and record.rate == 400.0 and record.burstiness == burstiness


async def test_open_loop_stops_at_wall_time(url: str) -> None:
    config = LoadConfig(rate=50.0, duration_s=0.3, drain_timeout_s=10)
    run = await run_load(url, specs(10_000), config)
    assert 0 < run.sent < 10_000 and len(run.traces) == run.sent
    assert max(t.start for t in run.traces) <= run.started + config.duration_s


async def test_warmup_requests_are_not_measured(url: str, state: FakeState) -> None:
    state.chunk_delay_s = 0.01
    run = await run_load(url, specs(10_000), LoadConfig(concurrency=2, duration_s=0.4, warmup_s=0.2))
    m = run.summarize()
    early = [t for t in run.traces if t.start < run.warmup_end]
    assert early and m.requests == len(run.traces) - len(early)


async def test_workload_object_and_record(url: str) -> None:
    work = RandomWorkload(requests=8, prompt_tokens=50, output_tokens=4, model="m", seed=3)
    run = await run_load(url + "/v1/", work.requests(), LoadConfig(concurrency=2, duration_s=30))
    record = run.to_record(policy="direct", workload=work.name)
    assert record.requests == 8 and record.completed == 8 and record.concurrency == 2
    assert record.output_tok_s > 0 and record.ttft_p90_s is not None
    assert record.loadgen_cpu_ms_per_request > 0 and record.loadgen_cpu_frac >= 0


async def test_tcp_nodelay_is_set_on_client_connections(url: str) -> None:
    # A stream that stays open, so the connection is still the response's when inspected.
    async with (
        open_session(2) as session,
        session.post(url + "/v1/chat/completions", json=request_body("chat", "hang", None, "hi", 2)) as resp,
    ):
        await resp.content.readline()
        assert resp.connection is not None and resp.connection.transport is not None
        sock = resp.connection.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


async def test_session_with_too_few_connections_is_refused(url: str) -> None:
    async with open_session(2) as session:
        with pytest.raises(ValueError, match="connections"):
            await run_load(url, specs(1), LoadConfig(concurrency=8), session=session)


async def test_scrape_counters(url: str) -> None:
    async with open_session(2) as session:
        counters = await scrape_counters(session, [url, "http://127.0.0.1:9"])
    assert list(counters) == [url]
    assert counters[url].prefix_queries == 100 and counters[url].prefix_hits == 40
    assert counters[url].preemptions == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"concurrency": 2, "rate": 1.0}, "exactly one"),
        ({"concurrency": 0}, "concurrency"),
        ({"rate": -1.0}, "rate"),
        ({"rate": 1.0, "burstiness": 0.0}, "burstiness"),
        ({"concurrency": 1, "duration_s": 0.0}, "duration_s"),
        ({"concurrency": 1, "max_requests": 0}, "max_requests"),
    ],
)
def test_load_config_rejects(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [1.0, 0.25, 4.0])
def test_inter_arrival_gaps_mean_and_burstiness(shape: float) -> None:
    gaps = inter_arrival_gaps(random.Random(1), rate=20.0, burstiness=shape)
    sample = [next(gaps) for _ in range(40_000)]
    mean = statistics.fmean(sample)
    cv = statistics.pstdev(sample) / mean
    assert mean == pytest.approx(1 / 20.0, rel=0.03)
    assert cv == pytest.approx(1 / shape**0.5, rel=0.05)
    again = inter_arrival_gaps(random.Random(1), rate=20.0, burstiness=shape)
    assert [next(again) for _ in range(100)] == sample[:100]


async def test_run_in_its_own_thread_and_progress_callback(url: str) -> None:
    seen: list[str] = []
    await run_load(url, specs(5), LoadConfig(concurrency=2), on_done=lambda t: seen.append(t.request_id))
    assert sorted(seen) == [f"r{i}" for i in range(5)]
    # The server keeps this loop; the runner gets a thread and loop of its own, and its CPU figure
    # then counts that thread only.
    threaded = await run_load_in_thread(url, list(specs(6)), LoadConfig(concurrency=3))
    assert threaded.sent == 6 and all(t.ok for t in threaded.traces)
