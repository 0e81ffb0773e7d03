"""`Simulation`: load points on a simulated fleet behind kvgate's routing, in virtual time, event by event.

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
  a gateway refreshes one replica's running/waiting/KV usage/adapters from its engine (APPLY: the
  numbers arrive `scrape_delay_s` later, when one is set); between scrapes only the gateway's own
  in-flight counts move;
- ARRIVAL (open loop), ALARM (request timeouts, `request_timeout_s`), DRAIN (`duration_s +
  drain_timeout_s`: what is still running is cancelled and counted `incomplete`).
- ADMIT, WAIT_END: with flow control modelled (`DesConfig.flow_control`) the gateway admits a request
  before routing it, and a held request waits for its queue's release or its band's max wait
  (`loadtests.des.admissions`).

Overheads: none for the network; `gateway_overhead_s` (default 0) is a fixed delay per request
between the client's send and the routing decision (the replica gets the request then).

Gateways. `DesConfig.views` puts N gateways in front of the fleet (`loadtests.des.gateways`), each
with its own prefix index, dispatch ledger and scrapes; each request goes to one of them (round robin
or at random). The run measures herding as the fleet's true in-flight skew (the busiest replica's
count above the mean, every gateway's dispatches counted), sampled at every dispatch.

The outcome (`DesResult`, see `loadtests.des.outcome`) has the live runner's shapes. Prefix hit
rates come from the engines' counters (Δhits / Δqueries in tokens), as live from `/metrics`.

Load points. One `Simulation` is one fleet and one gateway (one policy); `run(specs, load)` runs a
load point from the current virtual time and returns its outcome, and a later `run` continues on the
same fleet and gateway (warm caches, prefix index, scrape phases), as the live bench sends its warm-up
and then each load point to one fleet and one gateway. Counters in a point's outcome are increases
over that point, as the live bench scrapes `/metrics` before and after.

`begin(specs, load)` then `step()` per event runs a point one event at a time, to inspect the fleet,
a gateway's picture (`gateway.fleet.snapshot()`, `gateways.models[k]...`) and the clock
(`queue.now`) between events (tests do); `finish()` returns its outcome. Not thread-safe.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import replace
from typing import Any

from loadtests.des.admissions import Admissions
from loadtests.des.arrivals import LoadClients
from loadtests.des.config import AUTO_CHUNK_REQUESTS, DesConfig
from loadtests.des.events import EventQueue
from loadtests.des.fleet import SimReplica, build_replicas
from loadtests.des.gateway_model import GatewayModel, RouteError, gateway_config
from loadtests.des.gateways import Gateways
from loadtests.des.outcome import DesResult
from loadtests.des.point import LoadPoint
from loadtests.des.prompts import PromptError, PromptTokenizer, body_prompt_ids, engine_max_tokens
from loadtests.des.traces import OpenRequest
from loadtests.measures import RequestTrace
from loadtests.runner import LoadConfig
from loadtests.workloads.spec import RequestSpec
from policies.types import RequestInfo
from simulator.engine import EngineRequest

# Event kinds (plain ints: they are compared on every event).
SEND, ROUTE, STEP_END, SCRAPE, ARRIVAL, ALARM, DRAIN, APPLY, KV_EVENTS, ADMIT, WAIT_END = range(11)

GC_GEN0_THRESHOLD = 50_000
"""Allocations between young-generation collections while `Simulation.run` runs (CPython's is 700)."""


class Simulation:
    """A simulated fleet behind kvgate's routing, in virtual time (see the module docstring).

    Public state, for inspection between `step()`s (do not mutate): `queue` (clock and events),
    `replicas`, `gateways` (`gateways.models[k]` is gateway k; `gateway` is gateway 0), `open` (the
    point's requests in flight by engine id), `traces` (ended).
    """

    def __init__(self, config: DesConfig) -> None:
        self.config = config
        fleet = config.fleet
        self._exact = config.views.exact
        tokenizer = config.tokenizer
        if self._exact:
            # The exact index needs the engines' KV events and, as live, token ids to match with.
            if tokenizer == "none":
                raise ValueError("the exact index needs the sim tokenizer (tokenizer='sim')")
            tokenizer = "sim"
            fleet = replace(fleet, engine=replace(fleet.engine, kv_events=True))
        self.queue = EventQueue()
        self.replicas: list[SimReplica] = build_replicas(fleet)
        gw_config = gateway_config(
            config.gateway, fleet.names, fleet.model_name, policy=config.policy, tokenizer=tokenizer,
            scrape_interval_s=config.scrape_interval_s, stale_after_s=config.stale_after_s, seed=config.seed,
            flow_control=config.flow_control, latency_prior=fleet.profile,
        )  # fmt: skip
        self.gateways = Gateways(config.views, gw_config, self.queue, self.replicas, config.seed,
                                 SCRAPE, APPLY, config.flow_control)  # fmt: skip
        self.gateway = self.gateways.models[0]
        self._admissions = Admissions(self.queue, ADMIT, WAIT_END, self._is_open, self._dispatch, self._fail)
        self.tokenizer = PromptTokenizer()
        self.next_id = 0
        self._point: LoadPoint | None = None

    # -- load points ----------------------------------------------------------------------------------

    def begin(
        self,
        specs: Iterable[RequestSpec],
        load: LoadConfig,
        *,
        on_done: Callable[[RequestTrace], None] | None = None,
    ) -> None:
        """Start a load point at the current virtual time: `load`'s seconds count from now. The first
        point first has every gateway scrape every replica once (as `FleetScraper.start()` does
        before the gateway serves) and starts the periodic scrapes at evenly spread random phases.
        `on_done` is called with each trace as its request ends (keep it cheap)."""
        if self._point is not None and not self.done:
            raise RuntimeError("a load point is still running")
        queue, fleet = self.queue, self.config.fleet
        self.gateways.start(fleet.model_name, fleet.adapters)
        record = self.config.record_chunks
        if record is None:
            count = load.max_requests if load.max_requests is not None else _known_size(specs)
            record = count is not None and count <= AUTO_CHUNK_REQUESTS
        now = queue.now
        point = self._point = LoadPoint(
            load, now, record, on_done, self.replicas, queue, self.tokenizer, self.gateways
        )
        point.clients = clients = LoadClients(self._timed(specs, point), load, start=now)
        for spec, start in clients.start(now):
            self._push_send(spec, start)
        if clients.next_arrival is not None:
            point.arrival_pending = True
            queue.push(clients.next_arrival, ARRIVAL, point)
        drain_at = now + load.duration_s + load.drain_timeout_s
        if drain_at != float("inf"):
            queue.push(drain_at, DRAIN, point)

    @property
    def done(self) -> bool:
        """The load point has nothing in flight and will send nothing more (scrapes do not count)."""
        p = self._point
        return p is None or not (p.open or p.sends_pending or p.arrival_pending)

    @property
    def open(self) -> dict[str, OpenRequest]:
        return self._require().open

    @property
    def traces(self) -> list[RequestTrace]:
        return self._require().traces

    def step(self) -> bool:
        """Process the next event. False (and nothing done) once the load point is `done`."""
        if self.done:
            return False
        kind, arg = self.queue.pop()
        self._handle(kind, arg)
        return True

    def idle(self, seconds: float) -> None:
        """Once the load point is done: let `seconds` of virtual time pass with no request sent (the
        scrapes and KV events due meanwhile happen), to inspect the gateways' settled pictures."""
        if not self.done:
            raise RuntimeError("a load point is still running")
        queue = self.queue
        until = queue.now + seconds
        while (due := queue.peek_time()) is not None and due <= until:
            kind, arg = queue.pop()
            self._handle(kind, arg)
        queue.now = max(queue.now, until)

    def run(
        self,
        specs: Iterable[RequestSpec],
        load: LoadConfig,
        *,
        on_done: Callable[[RequestTrace], None] | None = None,
    ) -> DesResult:
        """One load point from now to its end (`begin`, every event until `done`, `finish`).

        While it runs, the interpreter's youngest-generation GC threshold is raised to
        `GC_GEN0_THRESHOLD` (and restored after): the engines make millions of short-lived objects, and
        at the default threshold (700) the collector's passes over the run's live objects cost ~8-10%
        of the run's CPU (measured at 256 replicas).
        """
        self.begin(specs, load, on_done=on_done)
        point = self._require()
        pop, handle = self.queue.pop, self._handle
        with _fewer_collections():
            while point.open or point.sends_pending or point.arrival_pending:
                kind, arg = pop()
                handle(kind, arg)
        return self.finish()

    def _is_open(self, o: OpenRequest) -> bool:
        return self._point is not None and o.engine_id in self._point.open

    def _require(self) -> LoadPoint:
        if self._point is None:
            raise RuntimeError("no load point has begun")
        return self._point

    def _timed(self, specs: Iterable[RequestSpec], point: LoadPoint) -> Iterator[RequestSpec]:
        it = iter(specs)
        clock = time.perf_counter
        while True:
            t0 = clock()
            spec = next(it, None)
            point.workload_s += clock() - t0
            if spec is None:
                return
            yield spec

    def _handle(self, kind: int, arg: Any) -> None:
        if kind == STEP_END:
            self._step_end(self.replicas[arg])
        elif kind in (SCRAPE, APPLY):
            t0 = time.perf_counter()
            if kind == SCRAPE:
                self.gateways.scrape(*arg)
            else:
                self.gateways.apply(*arg)
            if self._point is not None:
                self._point.scrape_s += time.perf_counter() - t0
        elif kind == SEND:
            sender, spec, start = arg
            point = self._point
            if point is not None and sender is point:  # not one cut by an earlier point's drain
                point.sends_pending -= 1
                self._send(spec, start)
        elif kind == ROUTE:
            self._route(arg)
        elif kind == ADMIT:
            self._admissions.woken(*arg)
        elif kind == WAIT_END:
            self._admissions.wait_end(arg)
        elif kind == KV_EVENTS:
            self.gateways.receive_events(*arg)
        elif kind == ARRIVAL and self._point is not None and arg is self._point:
            point = self._point
            clients = point.clients
            assert clients is not None
            for spec, start in clients.arrive(self.queue.now):
                self._send(spec, start)
            point.arrival_pending = clients.next_arrival is not None
            if clients.next_arrival is not None:
                self.queue.push(clients.next_arrival, ARRIVAL, point)
        elif kind == ALARM:
            if arg is self._point:  # not one left over from an earlier load point
                self._alarm()
        elif kind == DRAIN and arg is self._point:
            self._drain()

    # -- requests -------------------------------------------------------------------------------------

    def _send(self, spec: RequestSpec, start: float) -> None:
        point = self._require()
        now = self.queue.now
        self.next_id += 1
        o = OpenRequest(spec, start, str(self.next_id), point.record_chunks)
        point.open[o.engine_id] = o
        deadline = start + point.load.request_timeout_s
        if deadline <= now:  # it waited for a connection longer than the whole timeout
            self._fail(o, 0, self._timeout_error())
            return
        if point.watch(deadline, self.next_id, o.engine_id):
            self.queue.push(deadline, ALARM, point)
        if self.config.gateway_overhead_s:
            self.queue.push(now + self.config.gateway_overhead_s, ROUTE, o)
        else:
            self._route(o)

    def _route(self, o: OpenRequest) -> None:
        point = self._require()
        if o.engine_id not in point.open:
            return  # timed out or drained before the gateway got to it
        spec, perf = o.spec, time.perf_counter
        body = spec.body
        t0 = perf()
        try:
            ids = body_prompt_ids(self.tokenizer, spec.endpoint, body)
        except PromptError as err:
            point.tokenize_s += perf() - t0
            self._fail(o, 400, f"http: 400 {err}")
            return
        t1 = perf()
        point.tokenize_s += t1 - t0
        gw = self.gateways.pick()
        try:
            info = gw.request_info(
                spec.endpoint, body, prompt_ids=ids, tenant=spec.tenant, headers=spec.headers
            )
        except RouteError as err:
            point.route_s += perf() - t1
            self._fail(o, err.status, f"http: {err.status} {err.message}")
            return
        go = gw.admission is None or self._admissions.enter(o, gw, info, ids, spec.headers)
        point.route_s += perf() - t1
        if go:  # (else it waits at the gateway, or was refused)
            self._dispatch(o, gw, info, ids)

    def _dispatch(self, o: OpenRequest, gw: GatewayModel, info: RequestInfo, ids: list[int]) -> None:
        """Route `o` (admitted, or flow control not modelled) on `gw` and hand it to its replica."""
        point, perf, now = self._require(), time.perf_counter, self.queue.now
        t1 = perf()
        spec = o.spec
        body = spec.body
        gws = self.gateways
        try:
            routed = gw.route(info, now)
        except RouteError as err:
            point.route_s += perf() - t1
            self._fail(o, err.status, f"http: {err.status} {err.message}")
            return
        gws.dispatched(routed)
        point.skew.append(gws.skew())
        point.route_s += perf() - t1
        if gw.admission is not None:
            point.waits[spec.request_id] = now - o.start
        o.routed = routed
        o.replica = routed.replica
        o.prompt_tokens = len(ids)
        point.prompt_tokens += len(ids)
        rep = self.replicas[routed.replica]
        max_tokens = engine_max_tokens(spec.endpoint, body)
        error = rep.engine.validate(len(ids), max_tokens)
        if error is not None:
            self._fail(o, 400, f"http: 400 {error}")
            return
        seed = body.get("seed")
        request = EngineRequest(
            o.engine_id, ids, max_tokens, adapter=info.adapter, seed=seed if type(seed) is int else 0
        )
        if rep.submit(request, now):
            self._start_step(rep, now)

    def _start_step(self, rep: SimReplica, now: float) -> None:
        t0 = time.perf_counter()
        self.gateways.engine_changed(rep.index)
        result = rep.start_step(now)
        if self._point is not None:
            self._point.engine_s += time.perf_counter() - t0
        if result is not None:
            self.queue.push(result.end, STEP_END, rep.index)
        if self._exact:
            self.gateways.publish_events(rep.index, now if result is None else result.end, KV_EVENTS)

    def _step_end(self, rep: SimReplica) -> None:
        result = rep.step
        assert result is not None
        end = self.queue.now
        self._start_step(rep, end)  # the live driver steps again before its handlers write
        point = self._require()
        get = point.open.get
        if result.tokens:
            self.gateways.step_seen(rep.index, end)
        if point.record_chunks:
            for rid, _, index, _ in result.tokens:
                o = get(rid)
                if o is None:
                    continue  # aborted while the step ran
                if not index:
                    self._first_token(point, o, end)
                o.last = end
                o.chunks.append(end)  # type: ignore[union-attr]  # record_chunks: always a list
        else:
            counts = point.itl.counts
            for rid, _, index, _ in result.tokens:
                o = get(rid)
                if o is None:
                    continue
                if index:
                    key = round((end - o.last) * 1_000_000)
                    counts[key] = counts.get(key, 0) + 1
                else:
                    self._first_token(point, o, end)
                o.last = end
        for finished in result.finished:
            o = get(finished.request_id)
            if o is None:
                continue
            out, cached = finished.generation_tokens, finished.cached_tokens
            self._end(o, o.trace(end, output_tokens=out, cached_tokens=cached, replica_name=rep.name))

    def _first_token(self, point: LoadPoint, o: OpenRequest, end: float) -> None:
        o.first = end
        if o.admitted is not None:
            gw, info = o.admitted
            gw.prefilled(info)
        if o.routed is not None:
            error = self.gateways.first_token(o.routed, end)
            if error is not None:
                point.ttft_errors[o.spec.request_id] = error

    def _end(self, o: OpenRequest, trace: RequestTrace) -> None:
        point = self._require()
        del point.open[o.engine_id]
        if o.routed is not None:
            out = trace.output_tokens
            tpot = (o.last - o.first) / (out - 1) if o.first is not None and out >= 2 else None
            self.gateways.finished(o.routed, o.first is not None, tpot)
        if o.admitted is not None:
            gw, info = o.admitted
            gw.left(info)
        point.traces.append(trace)
        if point.on_done is not None:
            point.on_done(trace)
        now = self.queue.now
        assert point.clients is not None
        for spec, start in point.clients.finished(o.spec, now):
            self._push_send(spec, start)

    def _push_send(self, spec: RequestSpec, start: float) -> None:
        point = self._require()
        point.sends_pending += 1
        self.queue.push(self.queue.now, SEND, (point, spec, start))

    def _fail(self, o: OpenRequest, status: int, error: str) -> None:
        name = self.replicas[o.replica].name if o.replica >= 0 else None
        self._end(
            o,
            o.trace(
                self.queue.now,
                output_tokens=0,
                cached_tokens=None,
                status=status,
                error=error,
                replica_name=name,
            ),
        )

    def _timeout_error(self) -> str:
        return f"timeout: no complete response within {self._require().load.request_timeout_s:g}s"

    def _alarm(self) -> None:
        now = self.queue.now
        point = self._point
        if point is None or point.alarm_at != now:
            return  # superseded by an earlier alarm, or left over from an earlier point
        for o in point.overdue(now):
            self._abort(o)
            self._fail(o, 200 if o.first is not None else 0, self._timeout_error())
        if point.alarm_at is not None:
            self.queue.push(point.alarm_at, ALARM, point)

    def _abort(self, o: OpenRequest) -> None:
        """The client left: the gateway cancels the upstream request (the replica frees its blocks),
        or takes it out of its admission queue."""
        self._admissions.leave(o)
        if o.replica >= 0:
            self.replicas[o.replica].abort(o.engine_id, self.queue.now)
            self.gateways.engine_changed(o.replica)

    def _drain(self) -> None:
        """The drain deadline: cancel what still runs, as the live runner does (not measured)."""
        point = self._require()
        assert point.clients is not None
        point.clients.stop()
        point.arrival_pending = False
        point.sends_pending = 0
        for o in list(point.open.values()):
            self._abort(o)
            del point.open[o.engine_id]
            if o.routed is not None:
                self.gateways.finished(o.routed, o.first is not None)
            if o.admitted is not None:
                gw, info = o.admitted
                gw.left(info)
            point.incomplete += 1

    # -- the outcome ----------------------------------------------------------------------------------

    def finish(self) -> DesResult:
        """The current load point's outcome (call once `done`): counters are increases over the point,
        wall and CPU seconds count from its `begin`."""
        return self._require().outcome(self.config, self.replicas, self.queue, self.tokenizer, self.gateways)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    old = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_THRESHOLD, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _known_size(specs: Iterable[RequestSpec]) -> int | None:
    return len(specs) if isinstance(specs, Sized) else None
