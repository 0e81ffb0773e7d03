"""The real-time driver, without HTTP: what reaches a request's sink, and how the engine clock advances."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from simulator.engine import Engine, EngineConfig, EngineRequest, StepResult, TokenEvent
from simulator.profiles import get_profile
from simulator.server.driver import EngineDriver, EngineFailed, RequestSink
from simulator.server.metrics import ReplicaMetrics


class RecordingEngine(Engine):
    """The real engine, remembering the `now` and duration of every step that ran something."""

    def __init__(self, config: EngineConfig = EngineConfig()) -> None:
        super().__init__(get_profile("tiny"), config)
        self.steps: list[tuple[float, float]] = []

    def step(self, now: float) -> StepResult:
        result = super().step(now)
        if result.duration > 0:
            self.steps.append((now, result.duration))
        return result


class BrokenEngine(Engine):
    def __init__(self) -> None:
        super().__init__(get_profile("tiny"))

    def step(self, now: float) -> StepResult:
        raise RuntimeError("boom")


def request(rid: str, max_tokens: int = 5, prompt: int = 40) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_token_ids=list(range(1, prompt + 1)), max_tokens=max_tokens)


def metrics_for(engine: Engine) -> ReplicaMetrics:
    return ReplicaMetrics("tiny-llama", lambda: engine.stats, cache_config={}, max_loras=0, time_scale=1.0)


@pytest.fixture
async def started() -> AsyncIterator[list[EngineDriver]]:
    drivers: list[EngineDriver] = []
    yield drivers
    for driver in drivers:
        await driver.stop()


async def drain(sink: RequestSink) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    async with asyncio.timeout(5):
        while True:
            events += await sink.take()
            if sink.done:
                return events


def driver_for(engine: Engine, started: list[EngineDriver],
               **kw: object) -> tuple[EngineDriver, ReplicaMetrics]:
    metrics = metrics_for(engine)
    driver = EngineDriver(engine, metrics, **kw)  # type: ignore[arg-type]
    driver.start()
    started.append(driver)
    return driver, metrics


async def test_a_request_gets_exactly_its_tokens(started: list[EngineDriver]) -> None:
    driver, metrics = driver_for(RecordingEngine(), started, time_scale=0.5)
    events = await drain(driver.submit(request("a", max_tokens=5)))
    assert [e.index for e in events] == [0, 1, 2, 3, 4]
    assert [e.finished_reason for e in events] == [None, None, None, None, "length"]
    assert metrics.success["length"] == 1
    assert (metrics.ttft.count, metrics.e2e.count, metrics.queue.count, metrics.itl.count) == (1, 1, 1, 4)
    assert driver.num_open == 0


async def test_steps_follow_each_other_on_the_engine_clock(started: list[EngineDriver]) -> None:
    engine = RecordingEngine()
    # A generous catch-up allowance: a loaded test machine must not make the clock jump.
    driver, metrics = driver_for(engine, started, time_scale=0.5, catch_up_s=10.0)
    await drain(driver.submit(request("a", max_tokens=8)))
    assert len(engine.steps) == 8
    for (now, duration), (next_now, _) in zip(engine.steps, engine.steps[1:], strict=False):
        assert next_now == now + duration
    assert metrics.clock_jump_seconds == 0.0
    assert metrics.steps == 8
    assert metrics.step_lag.count == 7  # every step but the first was due when it started


async def test_slowdown_stretches_the_engine_clock(started: list[EngineDriver]) -> None:
    engine = RecordingEngine()
    driver, _ = driver_for(engine, started, time_scale=0.2, catch_up_s=10.0, slowdown=lambda: 3.0)
    await drain(driver.submit(request("a", max_tokens=4)))
    for (now, duration), (next_now, _) in zip(engine.steps, engine.steps[1:], strict=False):
        assert next_now == pytest.approx(now + 3.0 * duration)


async def test_abort_while_queued(started: list[EngineDriver]) -> None:
    engine = RecordingEngine(EngineConfig(max_num_seqs=1))
    driver, metrics = driver_for(engine, started, time_scale=1.0)
    busy = driver.submit(request("busy", max_tokens=30))
    queued = driver.submit(request("queued"))
    await busy.take()  # the engine is running "busy"; "queued" waits
    assert engine.stats.num_waiting == 1
    driver.abort("queued")
    assert await drain(queued) == []
    assert queued.reason == "abort"
    assert queued.finished is not None and queued.finished.first_scheduled is None
    assert metrics.success["abort"] == 1
    driver.abort("busy")
    await drain(busy)
    assert not engine.has_unfinished()
    assert engine.stats.kv_cache_usage == 0.0


async def test_a_stop_callback_finishes_the_request_at_that_token(started: list[EngineDriver]) -> None:
    engine = RecordingEngine()
    driver, metrics = driver_for(engine, started, time_scale=0.5)
    seen: list[int] = []

    def stop(token_id: int) -> bool:
        seen.append(token_id)
        return len(seen) == 3

    sink = driver.submit(request("a", max_tokens=10), stop)
    events = await drain(sink)
    assert len(events) == 3
    assert sink.reason == "stop"
    assert metrics.success["stop"] == 1
    assert not engine.has_unfinished()


async def test_an_engine_failure_fails_open_requests_and_new_ones(started: list[EngineDriver]) -> None:
    driver, _ = driver_for(BrokenEngine(), started)
    sink = driver.submit(request("a"))
    assert await drain(sink) == []
    assert sink.reason == "error"
    assert isinstance(driver.failed, RuntimeError)
    with pytest.raises(EngineFailed):
        driver.submit(request("b"))


async def test_stop_closes_open_sinks(started: list[EngineDriver]) -> None:
    driver, _ = driver_for(RecordingEngine(), started, time_scale=5.0)
    sink = driver.submit(request("a", max_tokens=100))
    await sink.take()
    await driver.stop()
    await drain(sink)
    assert sink.reason == "abort"
