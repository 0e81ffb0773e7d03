"""`Simulation`: one load point on a simulated fleet in virtual time, event by event.

The same pieces as a live run, with the network and the wall clock taken out: the workload's
`RequestSpec`s, the live runner's `LoadConfig` semantics (`arrivals.LoadClients`), kvgate's own routing
objects (`gateway_model.GatewayModel`) and the simulator's engine model (`fleet.SimReplica`). Events
(`events.EventQueue`), in virtual seconds from 0:

- SEND: a client sends a request (the closed loop's next request, an open-loop arrival); the gateway
  parses and routes it at once (or at ROUTE, `gateway_overhead_s` later), and the chosen replica gets
  it (an idle replica starts a step);
- STEP_END: a replica's step ends: its next step starts at that instant, then its tokens reach their
  clients (first token -> TTFT, each token -> ITL, the last -> E2E) and ended requests free their
  clients, whose next requests are SENT at the same instant;
- SCRAPE: every `fleet.scrape_interval_s` (x U(0.9, 1.1), phases spread as the live scraper does)
  the gateway refreshes one replica's running/waiting/KV usage/adapters from its engine; between
  scrapes only the gateway's own in-flight counts move;
- ARRIVAL (open loop), ALARM (request timeouts, `request_timeout_s`), DRAIN (`duration_s +
  drain_timeout_s`: what is still running is cancelled and counted `incomplete`).

Overheads: none for the network; `gateway_overhead_s` (default 0) is a fixed delay per request
between the client's send and the routing decision (the replica gets the request then).

The outcome (`DesResult`, see `loadtests.des.outcome`) has the live runner's shapes. Prefix hit
rates come from the engines' counters (Δhits / Δqueries in tokens), as live from `/metrics`.

Use `run()` for a whole run, or `start()` then `step()` per event to inspect the fleet, the gateway's
picture (`gateway.fleet.snapshot()`) and the clock (`queue.now`) between events (tests do). One
`Simulation` is one run; not thread-safe.
"""

from __future__ import annotations

import heapq
import random
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any

from loadtests.des.arrivals import LoadClients
from loadtests.des.config import AUTO_CHUNK_REQUESTS, DesConfig
from loadtests.des.events import EventQueue
from loadtests.des.fleet import SimReplica, build_replicas
from loadtests.des.gateway_model import GatewayModel, RouteError, gateway_config
from loadtests.des.outcome import DesResult, DesTimings, ReplicaReport
from loadtests.des.prompts import PromptError, PromptTokenizer, body_prompt_ids
from loadtests.des.traces import ItlHistogram, OpenRequest
from loadtests.measures import FleetDelta, RequestTrace
from loadtests.runner import LoadConfig
from loadtests.workloads.spec import RequestSpec
from simulator.engine import EngineRequest
from simulator.server.openai_schema import DEFAULT_MAX_TOKENS

# Event kinds (plain ints: they are compared on every event).
SEND, ROUTE, STEP_END, SCRAPE, ARRIVAL, ALARM, DRAIN = range(7)


class Simulation:
    """One load point of `specs` on `config`'s fleet under `load` (see the module docstring).

    Public state, for inspection between `step()`s (do not mutate): `queue` (clock and events),
    `replicas`, `gateway`, `clients`, `open` (requests in flight by engine id), `traces` (ended).
    """

    def __init__(
        self,
        specs: Iterable[RequestSpec],
        config: DesConfig,
        load: LoadConfig,
        *,
        on_done: Callable[[RequestTrace], None] | None = None,
    ) -> None:
        self.config = config
        self.load = load
        self.on_done = on_done
        fleet = config.fleet
        self.queue = EventQueue()
        self.replicas: list[SimReplica] = build_replicas(fleet)
        gw_config = gateway_config(
            config.gateway, fleet.names, fleet.model_name, policy=config.policy, tokenizer=config.tokenizer,
            scrape_interval_s=config.scrape_interval_s, stale_after_s=config.stale_after_s, seed=config.seed,
        )
        self.gateway = GatewayModel(gw_config, self.queue.clock, random.Random(f"des-route:{config.seed}"))
        self.scrape_interval = gw_config.fleet.scrape_interval_s
        self.scrape_rng = random.Random(f"des-scrape:{config.seed}")
        self.tokenizer = PromptTokenizer()
        self._workload_s = 0.0
        self.clients = LoadClients(self._timed(specs), load)
        record = config.record_chunks
        if record is None:
            count = load.max_requests if load.max_requests is not None else _known_size(specs)
            record = count is not None and count <= AUTO_CHUNK_REQUESTS
        self.record_chunks = record
        self.itl = ItlHistogram()
        self.open: dict[str, OpenRequest] = {}
        self.traces: list[RequestTrace] = []
        self.next_id = 0
        self.incomplete = 0
        self.prompt_tokens = 0
        self.timeouts: list[tuple[float, int, str]] = []
        self.alarm_at: float | None = None
        self.arrival_pending = False
        self.sends_pending = 0
        self.tokenize_s = self.route_s = self.engine_s = self.scrape_s = 0.0
        self._started: tuple[float, float] | None = None

    def _timed(self, specs: Iterable[RequestSpec]) -> Iterator[RequestSpec]:
        it = iter(specs)
        clock = time.perf_counter
        while True:
            t0 = clock()
            spec = next(it, None)
            self._workload_s += clock() - t0
            if spec is None:
                return
            yield spec

    # -- the loop -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Scrape every replica once and schedule the load (as `FleetScraper.start()` scrapes before
        the gateway serves), then the periodic scrapes at evenly spread random phases. Once."""
        if self._started is not None:
            raise RuntimeError("the simulation has already started")
        self._started = (time.perf_counter(), time.process_time())
        queue, gw, fleet = self.queue, self.gateway, self.config.fleet
        n = len(self.replicas)
        for rep in self.replicas:
            gw.serve_models(rep.index, fleet.model_name, fleet.adapters)
            gw.scrape(rep.index, rep.engine.stats)
        for i in range(n):
            queue.push(self.scrape_interval * (i + self.scrape_rng.random()) / n, SCRAPE, i)
        for spec, start in self.clients.start(0.0):
            self._push_send(spec, start)
        if self.clients.next_arrival is not None:
            self.arrival_pending = True
            queue.push(self.clients.next_arrival, ARRIVAL)
        drain_at = self.load.duration_s + self.load.drain_timeout_s
        if drain_at != float("inf"):
            queue.push(drain_at, DRAIN)

    @property
    def done(self) -> bool:
        """Nothing is in flight and nothing more will be sent (pending scrapes do not count)."""
        return not (self.open or self.sends_pending or self.arrival_pending)

    def step(self) -> bool:
        """Process the next event. False (and nothing done) once the run is `done`."""
        if self.done:
            return False
        kind, arg = self.queue.pop()
        self._handle(kind, arg)
        return True

    def run(self) -> DesResult:
        """`start()`, every event until `done`, and the outcome."""
        if self._started is None:
            self.start()
        pop, handle = self.queue.pop, self._handle
        while self.open or self.sends_pending or self.arrival_pending:
            kind, arg = pop()
            handle(kind, arg)
        return self.result()

    def _handle(self, kind: int, arg: Any) -> None:
        if kind == STEP_END:
            self._step_end(self.replicas[arg])
        elif kind == SCRAPE:
            queue = self.queue
            t0 = time.perf_counter()
            self.gateway.scrape(arg, self.replicas[arg].engine.stats)
            self.scrape_s += time.perf_counter() - t0
            queue.push(queue.now + self.scrape_interval * self.scrape_rng.uniform(0.9, 1.1), SCRAPE, arg)
        elif kind == SEND:
            self.sends_pending -= 1
            self._send(*arg)
        elif kind == ROUTE:
            self._route(arg)
        elif kind == ARRIVAL:
            clients = self.clients
            for spec, start in clients.arrive(self.queue.now):
                self._send(spec, start)
            self.arrival_pending = clients.next_arrival is not None
            if clients.next_arrival is not None:
                self.queue.push(clients.next_arrival, ARRIVAL)
        elif kind == ALARM:
            self._alarm()
        elif kind == DRAIN:
            self._drain()

    # -- requests -------------------------------------------------------------------------------------

    def _send(self, spec: RequestSpec, start: float) -> None:
        now = self.queue.now
        self.next_id += 1
        o = OpenRequest(spec, start, str(self.next_id), self.record_chunks)
        self.open[o.engine_id] = o
        deadline = start + self.load.request_timeout_s
        if deadline <= now:  # it waited for a connection longer than the whole timeout
            self._fail(o, 0, self._timeout_error())
            return
        heapq.heappush(self.timeouts, (deadline, self.next_id, o.engine_id))
        if self.alarm_at is None or deadline < self.alarm_at:
            self.alarm_at = deadline
            self.queue.push(deadline, ALARM)
        if self.config.gateway_overhead_s:
            self.queue.push(now + self.config.gateway_overhead_s, ROUTE, o)
        else:
            self._route(o)

    def _route(self, o: OpenRequest) -> None:
        if o.engine_id not in self.open:
            return  # timed out or drained before the gateway got to it
        now = self.queue.now
        spec, perf = o.spec, time.perf_counter
        body = spec.body
        t0 = perf()
        try:
            ids = body_prompt_ids(self.tokenizer, spec.endpoint, body)
        except PromptError as err:
            self.tokenize_s += perf() - t0
            self._fail(o, 400, f"http: 400 {err}")
            return
        t1 = perf()
        self.tokenize_s += t1 - t0
        gw = self.gateway
        try:
            info = gw.request_info(
                spec.endpoint, body, prompt_ids=ids, tenant=spec.tenant, headers=spec.headers
            )
            routed = gw.route(info, now)
        except RouteError as err:
            self.route_s += perf() - t1
            self._fail(o, err.status, f"http: {err.status} {err.message}")
            return
        self.route_s += perf() - t1
        o.routed = routed
        o.replica = routed.replica
        o.prompt_tokens = len(ids)
        self.prompt_tokens += len(ids)
        rep = self.replicas[routed.replica]
        max_tokens = _engine_max_tokens(spec.endpoint, body)
        error = rep.engine.validate(len(ids), max_tokens)
        if error is not None:
            self._fail(o, 400, f"http: 400 {error}")
            return
        seed = body.get("seed")
        request = EngineRequest(o.engine_id, ids, max_tokens, adapter=info.adapter,
                                seed=seed if type(seed) is int else 0)
        if rep.submit(request, now):
            self._start_step(rep, now)

    def _start_step(self, rep: SimReplica, now: float) -> None:
        t0 = time.perf_counter()
        result = rep.start_step(now)
        self.engine_s += time.perf_counter() - t0
        if result is not None:
            self.queue.push(result.end, STEP_END, rep.index)

    def _step_end(self, rep: SimReplica) -> None:
        result = rep.step
        assert result is not None
        end = self.queue.now
        self._start_step(rep, end)  # the live driver steps again before its handlers write
        opened = self.open
        get = opened.get
        if self.record_chunks:
            for rid, _, index, _ in result.tokens:
                o = get(rid)
                if o is None:
                    continue  # aborted while the step ran
                if not index:
                    o.first = end
                o.last = end
                o.chunks.append(end)  # type: ignore[union-attr]  # record_chunks: always a list
        else:
            counts = self.itl.counts
            for rid, _, index, _ in result.tokens:
                o = get(rid)
                if o is None:
                    continue
                if index:
                    key = round((end - o.last) * 1_000_000)
                    counts[key] = counts.get(key, 0) + 1
                else:
                    o.first = end
                o.last = end
        for finished in result.finished:
            o = get(finished.request_id)
            if o is None:
                continue
            self._end(o, o.trace(end, output_tokens=finished.generation_tokens,
                                 cached_tokens=finished.cached_tokens, replica_name=rep.name))

    def _end(self, o: OpenRequest, trace: RequestTrace) -> None:
        del self.open[o.engine_id]
        if o.routed is not None:
            self.gateway.finished(o.routed)
        self.traces.append(trace)
        if self.on_done is not None:
            self.on_done(trace)
        now = self.queue.now
        for spec, start in self.clients.finished(o.spec, now):
            self._push_send(spec, start)

    def _push_send(self, spec: RequestSpec, start: float) -> None:
        self.sends_pending += 1
        self.queue.push(self.queue.now, SEND, (spec, start))

    def _fail(self, o: OpenRequest, status: int, error: str) -> None:
        name = self.replicas[o.replica].name if o.replica >= 0 else None
        self._end(o, o.trace(self.queue.now, output_tokens=0, cached_tokens=None, status=status, error=error,
                             replica_name=name))

    def _timeout_error(self) -> str:
        return f"timeout: no complete response within {self.load.request_timeout_s:g}s"

    def _alarm(self) -> None:
        now = self.queue.now
        if self.alarm_at != now:
            return  # superseded by an earlier alarm
        timeouts, opened = self.timeouts, self.open
        while timeouts and (timeouts[0][0] <= now or timeouts[0][2] not in opened):
            _, _, rid = heapq.heappop(timeouts)
            o = opened.get(rid)
            if o is not None:
                self._abort(o)
                status = 200 if o.first is not None else 0
                self._fail(o, status, self._timeout_error())
        self.alarm_at = timeouts[0][0] if timeouts else None
        if self.alarm_at is not None:
            self.queue.push(self.alarm_at, ALARM)

    def _abort(self, o: OpenRequest) -> None:
        """The client left: the gateway cancels the upstream request (the replica frees its blocks)."""
        if o.replica >= 0:
            self.replicas[o.replica].abort(o.engine_id, self.queue.now)

    def _drain(self) -> None:
        """The drain deadline: cancel what still runs, as the live runner does (not measured)."""
        self.clients.stop()
        self.arrival_pending = False
        self.sends_pending = 0
        for o in list(self.open.values()):
            self._abort(o)
            del self.open[o.engine_id]
            if o.routed is not None:
                self.gateway.finished(o.routed)
            self.incomplete += 1

    # -- the outcome ----------------------------------------------------------------------------------

    def result(self) -> DesResult:
        """The outcome so far (call once `done`); wall and CPU seconds count from `start()`."""
        assert self._started is not None, "start() has not run"
        wall_s = time.perf_counter() - self._started[0]
        cpu_s = time.process_time() - self._started[1]
        reports = []
        queries = hits = preemptions = 0
        for rep in self.replicas:
            s = rep.engine.stats
            q, h = s.prefix_cache_queries_tokens, s.prefix_cache_hits_tokens
            queries += q
            hits += h
            preemptions += s.num_preemptions
            reports.append(ReplicaReport(
                name=rep.name, requests=rep.routed, prefix_queries_tokens=q, prefix_hits_tokens=h,
                prefix_hit_rate=h / q if q else None, preemptions=s.num_preemptions,
                generation_tokens=s.generation_tokens, steps=s.steps, busy_s=s.busy_s,
            ))
        return DesResult(
            config=self.config,
            load=self.load,
            traces=self.traces,
            warmup_end=self.load.warmup_s,
            itl=None if self.record_chunks else self.itl.stats(),
            fleet=FleetDelta(prefix_queries=queries, prefix_hits=hits, preemptions=preemptions),
            replicas=tuple(reports),
            sent=self.clients.dispensed,
            incomplete=self.incomplete,
            events=self.queue.processed,
            wall_s=wall_s,
            cpu_s=cpu_s,
            virtual_s=self.queue.now,
            peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            timings=DesTimings(self._workload_s, self.tokenize_s, self.route_s, self.engine_s, self.scrape_s),
            tokens_encoded=self.tokenizer.tokens_encoded,
            prompt_tokens=self.prompt_tokens,
        )


def _known_size(specs: Iterable[RequestSpec]) -> int | None:
    return len(specs) if isinstance(specs, Sized) else None


def _engine_max_tokens(endpoint: str, body: Mapping[str, Any]) -> int:
    """The output cap the simulated replica applies (`simulator.server.openai_schema`)."""
    cap = body.get("max_completion_tokens") if endpoint == "chat" else None
    if cap is None:
        cap = body.get("max_tokens")
    return cap if type(cap) is int else DEFAULT_MAX_TOKENS

