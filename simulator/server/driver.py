"""Runs one engine in wall-clock time and hands each request's tokens to its HTTP handler.

The engine clock is in simulated seconds: `sim_now = (monotonic() - t0) / time_scale`, so with
`time_scale` S one simulated second takes S wall seconds (S > 1 is slower). One asyncio task per replica
loops: wait for work (an `asyncio.Event`, no polling), `res = engine.step(now)`, sleep until the step's
absolute deadline `t0 + (now + duration * slowdown) * S`, then deliver `res.tokens` to per-request sinks.

Faithfulness: while the engine has work, step k+1 starts at step k's simulated end, and its deadline is
absolute, so the loop's own overhead does not accumulate drift: a step that starts a little late gets a
shorter sleep. If the driver falls more than `catch_up_s` wall seconds behind (the simulator's CPU is
saturated), the engine clock jumps forward to the wall clock instead of racing to catch up; the skipped
simulated time is counted in `kvgate_sim_clock_jump_seconds_total`, and every step's lateness in
`kvgate_sim_step_lag_seconds`. Requests that arrive mid-step and aborts are applied at the next step
boundary, as vLLM's scheduler sees them; arrival times are kept (never later than the step they join).

KV-cache events (when the replica publishes them): each step's events are taken from the engine when
the step is scheduled and published when it ends, with its tokens, as vLLM publishes a step's events
once its output is in (`update_from_output`): one batch per step, none for a step without events.

Everything here runs on the replica's event loop; nothing is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from simulator.engine import Engine, EngineRequest, FinishedRequest, StepResult, TokenEvent
from simulator.kv_events.events import KVEvent
from simulator.server.metrics import ReplicaMetrics

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.01
"""Wall seconds between retries when the engine holds requests but can run none of them."""
_TIMER_SLACK_S = 0.0005
"""Event-loop timers fire up to ~1 ms late (millisecond poll timeouts): aim this much early, so wake-ups
scatter around the deadline instead of always after it. Within this of the deadline counts as on time."""


class KVEventSink(Protocol):
    def publish(self, events: Sequence[KVEvent]) -> object:
        """Send one step's events; must neither block nor raise."""
        ...


class EngineFailed(RuntimeError):
    """The engine raised; the replica is dead (health answers 503, new requests 500)."""


class RequestSink:
    """One request's token events on their way from the driver to its handler.

    The driver appends events and closes the sink with the engine's `FinishedRequest` (None when the
    replica failed or stopped); the handler awaits `take()`. `reason` is the finish reason the client
    should see: "length", "stop", "abort" or "error". Times are simulated seconds on the engine clock.
    """

    __slots__ = ("_stop", "_waiter", "events", "finish_time", "finished", "first_token_time",
                 "last_token_time", "reason", "request_id")

    def __init__(self, request_id: str, stop: Callable[[int], bool] | None = None) -> None:
        self.request_id = request_id
        self.events: list[TokenEvent] = []
        self.finished: FinishedRequest | None = None
        self.reason: str | None = None
        self.finish_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self._stop = stop
        self._waiter: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        return self.reason is not None

    def push(self, event: TokenEvent) -> bool:
        """Queue one token; True when it completes a stop string (the driver then stops the request)."""
        self.events.append(event)
        waiter = self._waiter  # _wake() inlined: this runs for every token of every stream
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return self._stop is not None and self._stop(event.token_id)

    def close(self, finished: FinishedRequest | None, when: float, reason: str) -> None:
        if self.reason is None:
            self.finished = finished
            self.finish_time = when
            self.reason = reason
        self._wake()

    async def take(self) -> list[TokenEvent]:
        """The events queued since the last call, waiting while there are none and the request runs.

        Returns an empty list only once the sink is closed and drained.
        """
        if not self.events and self.reason is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        events = self.events
        self.events = []
        return events

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class EngineDriver:
    """Drives `engine` in real time (see the module docstring). Owned by one replica.

    `slowdown()` is read every step (the slowdown fault). `clock` is a monotonic wall clock in seconds.
    `lora_enabled` makes every step record the running/waiting adapter combination for
    `vllm:lora_requests_info`. `kv_events` gets each step's KV-cache events (the engine must record
    them: `EngineConfig.kv_events`).
    """

    def __init__(
        self,
        engine: Engine,
        metrics: ReplicaMetrics,
        *,
        time_scale: float = 1.0,
        slowdown: Callable[[], float] = lambda: 1.0,
        catch_up_s: float = 0.02,
        lora_enabled: bool = False,
        kv_events: KVEventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.time_scale = time_scale
        self.failed: BaseException | None = None
        self._metrics = metrics
        self._slowdown = slowdown
        self._catch_up_s = catch_up_s
        self._lora_enabled = lora_enabled
        self._kv_events = kv_events
        self._clock = clock
        self._t0 = clock()
        self._sinks: dict[str, RequestSink] = {}
        self._arrivals: list[tuple[EngineRequest, float]] = []
        self._aborts: list[tuple[str, str]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._prev_end: float | None = None

    # -- handler side ----------------------------------------------------------------------------------

    def now(self) -> float:
        """The engine clock: simulated seconds since the driver was made."""
        return (self._clock() - self._t0) / self.time_scale

    def submit(self, request: EngineRequest, stop: Callable[[int], bool] | None = None) -> RequestSink:
        """Queue `request` for the engine (it joins at the next step boundary) and return its sink.

        `stop(token_id)` is called on every token and returns True once a stop string completed.
        Raises `EngineFailed` when the engine is dead.
        """
        if self.failed is not None:
            raise EngineFailed("the engine failed") from self.failed
        sink = RequestSink(request.request_id, stop)
        self._sinks[request.request_id] = sink
        self._arrivals.append((request, self.now()))
        self._wake.set()
        return sink

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Finish a running or queued request at the next step boundary (frees its KV blocks)."""
        if request_id in self._sinks:
            self._aborts.append((request_id, reason))
            self._wake.set()

    @property
    def num_open(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._sinks)

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="kvgate-sim-driver")

    async def stop(self) -> None:
        """Stop the loop and close every open sink (their handlers see reason "abort")."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close_all("abort")

    # -- the loop --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("simulated engine failed; the replica is now dead")
            self.failed = exc
            self._close_all("error")

    async def _loop(self) -> None:
        engine, clock, scale, t0, metrics = self.engine, self._clock, self.time_scale, self._t0, self._metrics
        kv_sink = self._kv_events
        due: float | None = None  # wall deadline of the previous step, while work remained
        end = 0.0  # simulated end of the previous step
        while True:
            if not (self._arrivals or self._aborts or engine.has_unfinished()):
                due = None
                self._wake.clear()
                await self._wake.wait()
            wall = clock()
            lag: float | None = None
            if due is None:
                now = max(end, (wall - t0) / scale)
            else:
                lag = wall - due
                if lag <= self._catch_up_s:
                    now = end
                else:
                    now = (wall - t0) / scale
                    metrics.clock_jump_seconds += now - end
            self._admit(now)
            result = engine.step(now)
            if result.duration <= 0.0 and not result.tokens and not result.finished:
                due, end = None, now
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_IDLE_POLL_S):
                        await self._wake.wait()
                continue
            kv_events = engine.take_kv_events() if kv_sink is not None else None
            duration = result.duration * self._slowdown()
            end = now + duration
            due = t0 + end * scale
            metrics.observe_step(duration * scale, lag)
            if self._lora_enabled:
                stats = engine.stats
                metrics.note_lora(stats.running_adapters, stats.waiting_adapters)
            slept = False
            while (left := due - clock()) > _TIMER_SLACK_S:
                await asyncio.sleep(left - _TIMER_SLACK_S)
                slept = True
            if not slept:
                await asyncio.sleep(0)  # behind schedule: still let the handlers write
            self._deliver(result, end)
            if kv_sink is not None and kv_events:
                kv_sink.publish(kv_events)

    def _admit(self, now: float) -> None:
        if self._arrivals:
            arrivals, self._arrivals = self._arrivals, []
            for request, arrival in arrivals:
                try:
                    self.engine.add_request(request, arrival if arrival < now else now)
                except Exception:
                    log.exception("engine refused request %s", request.request_id)
                    sink = self._sinks.pop(request.request_id, None)
                    if sink is not None:
                        sink.close(None, now, "error")
        if self._aborts:
            aborts, self._aborts = self._aborts, []
            for request_id, reason in aborts:
                if request_id in self._sinks:
                    self._finish(self.engine.finish_request(request_id, now, reason), request_id, now, reason)

    def _deliver(self, result: StepResult, end: float) -> None:
        sinks, itl = self._sinks, self._metrics.itl
        prev = self._prev_end
        contiguous = 0
        stopped: list[str] | None = None
        for event in result.tokens:
            sink = sinks.get(event.request_id)
            if sink is None:
                continue
            last = sink.last_token_time
            if last is None:
                sink.first_token_time = end
            elif last == prev:
                contiguous += 1  # the common case: decoded in the previous step too; observed in bulk
            else:
                itl.observe(end - last)
            sink.last_token_time = end
            if sink.push(event):
                if stopped is None:
                    stopped = []
                stopped.append(event.request_id)
        if contiguous and prev is not None:
            itl.observe_n(end - prev, contiguous)
        self._prev_end = end
        for finished in result.finished:
            self._finish(finished, finished.request_id, end, finished.reason)
        if stopped:
            for request_id in stopped:
                if request_id in sinks:
                    self._finish(self.engine.finish_request(request_id, end, "stop"), request_id, end, "stop")

    def _finish(self, finished: FinishedRequest | None, request_id: str, when: float, reason: str) -> None:
        sink = self._sinks.pop(request_id, None)
        if finished is not None:
            first_token = sink.first_token_time if sink is not None else finished.first_token
            self._metrics.record_finished(finished.reason, finished.arrival, finished.first_scheduled,
                                          first_token, when)
            reason = finished.reason
        if sink is not None:
            sink.close(finished, when, reason)

    def _close_all(self, reason: str) -> None:
        sinks, self._sinks = self._sinks, {}
        self._arrivals.clear()
        self._aborts.clear()
        when = self.now()
        for sink in sinks.values():
            sink.close(None, when, reason)
