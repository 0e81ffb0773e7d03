"""The load generator: sends a workload's requests to an OpenAI-compatible base URL and traces them.

`run_load(base_url, specs, config)` drives one load point, closed loop (`concurrency` workers, each
sending its next request when the previous one ends) or open loop (arrivals at `rate` requests/s,
Poisson or, with `burstiness` < 1, burstier gamma-distributed gaps, drawn from a seeded rng). It is
bounded by `max_requests` (all requests sent, warm-up included) and by `duration_s` (no request starts
after it; requests in flight then get `drain_timeout_s` to finish and are cancelled after, counted as
`incomplete` and not measured). Requests that share a `session_id` go one after another (see
`loadtests.workloads.spec`); in the open loop an arrival whose next request waits on its session sends
it as soon as the session is free.

`base_url` is a replica or the gateway (`http://host:port`, with or without a trailing `/v1`). Each
request carries its spec's `request_id` as `x-request-id` (a spec's own headers may replace it): kvgate
keeps a client's id in its access log, so a trace finds its line there.

One aiohttp `ClientSession` carries every request, with a connection limit of at least the concurrency
(aiohttp sets TCP_NODELAY on every connection it opens: `aiohttp.base_protocol`, checked by the tests).
Streams are read by `loadtests.sse_stream.SseStream`: content-chunk arrival times, usage, error
events, `[DONE]`; chunks that arrive in one network read share its timestamp. A request whose body
says `"stream": false` gets one JSON answer: its usage is read, and its trace has no first token.
Errors are classified in each trace (HTTP status, error event, broken connection, timeout, stream
without `[DONE]`), and the `x-kvgate-replica` response header is kept when present.

The generator measures its own CPU with `time.thread_time()` over the run: the CPU of the thread whose
event loop runs it. A server sharing that loop is counted too; run the fleet or gateway in another
process (or call `run_load_in_thread`) for a clean figure. Above 0.8 of a core the run is flagged: the
generator may be what limits it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson

from loadtests.measures import (
    FleetDelta,
    LoadgenUsage,
    Measures,
    ReplicaCounters,
    RequestTrace,
    parse_replica_counters,
    summarize,
)
from loadtests.results import RunRecord, make_record
from loadtests.slo import Slo
from loadtests.sse_stream import SseStream, error_message
from loadtests.workloads.sequencer import SessionSequencer
from loadtests.workloads.spec import ENDPOINT_PATHS, RequestSpec

REPLICA_HEADER: Final = "x-kvgate-replica"


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """One load point. Exactly one of `concurrency` (closed loop, >= 1) and `rate` (open loop,
    requests/s > 0). `burstiness` is the gamma shape of open-loop inter-arrival gaps (1 = Poisson;
    mean gap is always 1/rate). Seconds throughout. `max_requests` counts every request sent, warm-up
    included (None: until the workload or `duration_s` ends). `max_in_flight` caps open-loop
    connections (arrivals beyond it wait for one, and that wait counts in their TTFT). `headers` go
    on every request."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    duration_s: float = 60.0
    max_requests: int | None = None
    warmup_s: float = 0.0
    request_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0
    seed: int = 0
    max_in_flight: int = 4096
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) and rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness (gamma shape) must be > 0, got {self.burstiness}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if self.warmup_s < 0 or self.drain_timeout_s < 0 or not self.request_timeout_s > 0:
            raise ValueError("warmup_s and drain_timeout_s must be >= 0 and request_timeout_s > 0")

    @property
    def connections(self) -> int:
        """Connections the session needs: the concurrency, or `max_in_flight` in the open loop."""
        return self.concurrency if self.concurrency is not None else self.max_in_flight


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one `run_load` call saw. Times are `perf_counter()` seconds; `traces` are in completion
    order. `sent` counts requests sent (warm-up included); `incomplete` those cancelled at the drain
    deadline (not in `traces`). `max_schedule_lag_s` is the open loop's worst delay between an
    arrival's scheduled time and its send (0 for the closed loop): a large value means the generator
    fell behind."""

    config: LoadConfig
    traces: list[RequestTrace]
    started: float
    warmup_end: float
    wall_s: float
    sent: int
    incomplete: int
    loadgen: LoadgenUsage
    max_schedule_lag_s: float

    def summarize(self, slo: Slo | None = None) -> Measures:
        return summarize(self.traces, warmup_end=self.warmup_end, slo=slo)

    def to_record(
        self, *, policy: str, workload: str, slo: Slo | None = None, fleet: FleetDelta | None = None
    ) -> RunRecord:
        """The results record of this run (see `loadtests.results`)."""
        c = self.config
        return make_record(
            policy=policy,
            workload=workload,
            measures=self.summarize(slo),
            loadgen=self.loadgen,
            concurrency=c.concurrency,
            rate=c.rate,
            burstiness=c.burstiness,
            warmup_s=c.warmup_s,
            incomplete=self.incomplete,
            fleet=fleet,
        )


def inter_arrival_gaps(rng: random.Random, rate: float, burstiness: float = 1.0) -> Iterator[float]:
    """Endless seconds between open-loop arrivals: gamma-distributed with shape `burstiness` and mean
    1 / `rate` (requests/s), so their coefficient of variation is 1 / sqrt(burstiness). Shape 1 is the
    exponential (a Poisson process); below 1 arrivals come in bursts separated by lulls."""
    if not rate > 0 or not burstiness > 0:
        raise ValueError(f"rate and burstiness must be > 0, got {rate}, {burstiness}")
    scale = 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, scale)


def open_session(connections: int, request_timeout_s: float = 300.0) -> aiohttp.ClientSession:
    """The shared client session: up to `connections` connections (all to one host is fine),
    keep-alive, no compression, a total timeout per request. Call from inside the event loop."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=request_timeout_s),
        auto_decompress=False,
    )


async def run_load(
    base_url: str,
    specs: Iterable[RequestSpec],
    config: LoadConfig,
    *,
    session: aiohttp.ClientSession | None = None,
    on_done: Callable[[RequestTrace], None] | None = None,
) -> RunResult:
    """Run one load point against `base_url` and return every request's trace.

    `specs` are pulled lazily, inside the run: generating a long prompt's text costs about 2 µs per
    token on this machine, so for long prompts or high rates pass a list built beforehand
    (`list(workload.requests())`), or the generator's CPU figure includes text generation.
    With `session` None a session is opened and closed here; a given session must allow at least
    `config.connections` connections (its connector's limit, 0 = unlimited). `on_done` is called in
    the loop after each request (e.g. to advance a progress bar); keep it cheap.
    """
    own = session is None
    if session is None:
        session = open_session(config.connections, config.request_timeout_s)
    else:
        limit = session.connector.limit if session.connector is not None else 0
        if limit and limit < config.connections:
            raise ValueError(f"session allows {limit} connections, the load point needs {config.connections}")
    try:
        return await _Run(base_url, specs, config, session, on_done).run()
    finally:
        if own:
            await session.close()


async def run_load_in_thread(base_url: str, specs: Iterable[RequestSpec], config: LoadConfig) -> RunResult:
    """`run_load` on its own thread and event loop (uvloop when installed), so that its CPU figure
    excludes whatever else runs in the caller's loop (an in-process fleet, say). They still share the
    GIL: for the cleanest figures run the server in another process."""

    def in_thread() -> RunResult:
        try:
            import uvloop

            loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
        except ImportError:
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(run_load(base_url, specs, config))

    return await asyncio.to_thread(in_thread)


async def scrape_counters(
    session: aiohttp.ClientSession, replica_urls: Iterable[str]
) -> dict[str, ReplicaCounters]:
    """Each replica's prefix-cache and preemption counters from its `/metrics`, keyed by URL. A replica
    that does not answer 200 is left out (`fleet_delta` then counts it from zero if it answers later)."""

    async def one(url: str) -> tuple[str, ReplicaCounters | None]:
        try:
            async with session.get(_root(url) + "/metrics") as resp:
                if resp.status != 200:
                    return url, None
                return url, parse_replica_counters(await resp.text())
        except (aiohttp.ClientError, TimeoutError):
            return url, None

    pairs = await asyncio.gather(*(one(u) for u in replica_urls))
    return {url: counters for url, counters in pairs if counters is not None}


def _root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


class _Run:
    """One load point in progress; owned by `run_load`."""

    def __init__(
        self,
        base_url: str,
        specs: Iterable[RequestSpec],
        config: LoadConfig,
        session: aiohttp.ClientSession,
        on_done: Callable[[RequestTrace], None] | None,
    ) -> None:
        root = _root(base_url)
        self._urls = {endpoint: root + path for endpoint, path in ENDPOINT_PATHS.items()}
        self._config = config
        self._session = session
        self._on_done = on_done
        self._sequencer = SessionSequencer(iter(specs), config.max_requests)
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **config.headers}
        self._traces: list[RequestTrace] = []
        self._in_flight = 0
        self._max_lag = 0.0
        self._timeout = aiohttp.ClientTimeout(total=config.request_timeout_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._deadline = float("inf")  # set when the run starts
        self._unsent = 0

    async def run(self) -> RunResult:
        config = self._config
        loop = asyncio.get_running_loop()
        cpu0 = time.thread_time()
        started = time.perf_counter()
        self._deadline = started + config.duration_s
        stop_timer = loop.call_later(config.duration_s, self._sequencer.stop)
        try:
            if config.concurrency is not None:
                for _ in range(config.concurrency):
                    self._spawn(self._worker())
            else:
                await self._arrivals(started + config.duration_s)
            incomplete = await self._drain(started + config.duration_s + config.drain_timeout_s)
        finally:
            stop_timer.cancel()
            for task in list(self._tasks):
                task.cancel()
        if self._failure is not None:
            raise RuntimeError("the load generator failed (a bug, not a server error)") from self._failure
        wall = time.perf_counter() - started
        cpu = time.thread_time() - cpu0
        sent = self._sequencer.dispensed - self._unsent
        return RunResult(
            config=config,
            traces=self._traces,
            started=started,
            warmup_end=started + config.warmup_s,
            wall_s=wall,
            sent=sent,
            incomplete=incomplete,
            loadgen=LoadgenUsage(cpu_s=cpu, wall_s=wall, requests=sent),
            max_schedule_lag_s=self._max_lag,
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None and self._failure is None:
            self._failure = exc
            self._sequencer.stop()

    async def _drain(self, deadline: float) -> int:
        """Wait for the run's tasks until `deadline`, then cancel the rest; the requests cut short."""
        if self._tasks:
            timeout = max(deadline - time.perf_counter(), 0.0)
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending:
                self._sequencer.stop()
                cut = self._in_flight
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                return cut
        return 0

    async def _worker(self) -> None:
        sequencer = self._sequencer
        while (spec := await sequencer.get()) is not None:
            await self._send(spec)

    async def _arrivals(self, deadline: float) -> None:
        config = self._config
        assert config.rate is not None
        gaps = inter_arrival_gaps(random.Random(f"arrivals:{config.seed}"), config.rate, config.burstiness)
        sequencer = self._sequencer
        due = time.perf_counter()
        while due < deadline:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            spec = sequencer.take()
            if spec is None:
                return
            if isinstance(spec, RequestSpec):
                self._max_lag = max(self._max_lag, time.perf_counter() - due)
                self._spawn(self._send(spec))
            else:
                self._spawn(self._send_when_free())
            due += next(gaps)

    async def _send_when_free(self) -> None:
        spec = await self._sequencer.get()
        if spec is not None:
            await self._send(spec)

    async def _send(self, spec: RequestSpec) -> None:
        start = time.perf_counter()
        if start >= self._deadline:
            # The stop timer fires a little late: what was handed out after the deadline is not sent.
            self._sequencer.stop()
            self._sequencer.finished(spec)
            self._unsent += 1
            return
        self._in_flight += 1
        try:
            trace = await self._request(spec, start)
        finally:
            self._in_flight -= 1
            self._sequencer.finished(spec)
        self._traces.append(trace)
        if self._on_done is not None:
            self._on_done(trace)

    async def _request(self, spec: RequestSpec, start: float) -> RequestTrace:
        # The spec's id as the request's: a gateway keeps it in its access log line, so each trace
        # finds its line there (kvgate bench reads the latency model's errors from it).
        headers = {**self._headers, "x-request-id": spec.request_id, **spec.headers}
        if spec.api_key is not None:
            headers["Authorization"] = f"Bearer {spec.api_key}"
        stream = SseStream()
        status = 0
        replica: str | None = None
        error: str | None = None
        try:
            async with self._session.post(
                self._urls[spec.endpoint],
                data=orjson.dumps(spec.body),
                headers=headers,
                timeout=self._timeout,
            ) as resp:
                status = resp.status
                replica = resp.headers.get(REPLICA_HEADER)
                if status != 200:
                    error = f"http: {status} {_error_message(await resp.read())}"
                elif spec.body.get("stream") is False:  # one JSON answer: usage, no chunk times
                    stream.whole(await resp.read())
                    error = stream.error
                else:
                    await stream.consume(resp.content)
                    error = stream.error
        except TimeoutError as exc:
            error = f"timeout: no complete response within {self._config.request_timeout_s:g}s {exc}".rstrip()
        except aiohttp.ClientError as exc:
            error = f"connection: {type(exc).__name__}: {exc}"
        end = time.perf_counter()
        chunk_times = stream.chunk_times
        return RequestTrace(
            request_id=spec.request_id,
            tenant=spec.tenant,
            group=spec.group,
            start=start,
            first_token=chunk_times[0] if chunk_times else None,
            end=end,
            chunk_times=chunk_times,
            output_tokens=stream.completion_tokens
            if stream.completion_tokens is not None
            else len(chunk_times),
            prompt_tokens=stream.prompt_tokens,
            cached_tokens=stream.cached_tokens,
            status=status,
            error=error,
            replica=replica,
        )


def _error_message(body: bytes) -> str:
    """The message of an error body in OpenAI's shape, else the body's start."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace")
    if isinstance(parsed, dict) and "error" in parsed:
        return error_message(parsed["error"])
    return str(parsed)[:200]
