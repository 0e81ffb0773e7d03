"""`LoadPoint`: the state of one load point while a `Simulation` runs it, and its outcome.

Owned by one `Simulation` (one point at a time); nothing here touches the event queue. Counters in
the outcome are increases over the point (the fleet's engine counters, the tokenizer's work), as the
live bench scrapes `/metrics` before and after a point; wall and CPU seconds count from the point's
creation.
"""

from __future__ import annotations

import heapq
import resource
import time
from collections.abc import Callable, Sequence

from loadtests.des.arrivals import LoadClients
from loadtests.des.config import DesConfig
from loadtests.des.events import EventQueue
from loadtests.des.fleet import SimReplica
from loadtests.des.gateways import Gateways
from loadtests.des.outcome import DesResult, DesTimings, ReplicaReport, SkewStats
from loadtests.des.prompts import PromptTokenizer
from loadtests.des.traces import ItlHistogram, OpenRequest
from loadtests.measures import FleetDelta, RequestTrace, measured, prediction_errors
from loadtests.runner import LoadConfig

Counters = tuple[int, int, int, int, int, float]


def replica_counters(rep: SimReplica) -> Counters:
    """(prefix queries, prefix hits, preemptions, generation tokens, steps, busy seconds) so far."""
    s = rep.engine.stats
    return (s.prefix_cache_queries_tokens, s.prefix_cache_hits_tokens, s.num_preemptions,
            s.generation_tokens, s.steps, s.busy_s)  # fmt: skip


class LoadPoint:
    """One load point in progress. The `Simulation` reads and writes its fields directly: `open`
    (requests in flight by engine id), `traces` (ended, in end order), `itl` (gaps when chunk times
    are not kept), `timeouts` (a heap of (deadline, seq, engine id)), `alarm_at`, the pending-event
    counts, the seconds spent per part (`workload_s`, `tokenize_s`, `route_s`, `engine_s`,
    `scrape_s`), and `skew`, the fleet's in-flight skew at each dispatch (`SkewStats`)."""

    __slots__ = ("alarm_at", "arrival_pending", "clients", "cpu0", "engine_s", "events0",
                 "gateway_routed0",
                 "incomplete", "itl", "load", "on_done", "open", "prompt_tokens", "record_chunks", "route_s",
                 "routed0", "scrape_s", "sends_pending", "skew", "start", "stats0", "timeouts", "tokenize_s",
                 "tokens0", "traces", "ttft_errors", "waits", "wall0", "workload_s")  # fmt: skip

    def __init__(self, load: LoadConfig, start: float, record_chunks: bool,
                 on_done: Callable[[RequestTrace], None] | None, replicas: Sequence[SimReplica],
                 queue: EventQueue, tokenizer: PromptTokenizer, gateways: Gateways) -> None:  # fmt: skip
        self.load = load
        self.start = start
        self.record_chunks = record_chunks
        self.on_done = on_done
        self.clients: LoadClients | None = None
        self.open: dict[str, OpenRequest] = {}
        self.traces: list[RequestTrace] = []
        self.itl = ItlHistogram()
        self.timeouts: list[tuple[float, int, str]] = []
        self.alarm_at: float | None = None
        self.arrival_pending = False
        self.sends_pending = 0
        self.incomplete = 0
        self.prompt_tokens = 0
        self.skew: list[float] = []
        self.workload_s = self.tokenize_s = self.route_s = self.engine_s = self.scrape_s = 0.0
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        self.events0 = queue.processed
        self.tokens0 = tokenizer.tokens_encoded
        self.stats0 = [replica_counters(rep) for rep in replicas]
        self.routed0 = [rep.routed for rep in replicas]
        self.gateway_routed0 = [m.routed for m in gateways.models]
        # Per request id, the latency model's TTFT error (scored at its first token); the outcome
        # keeps the measured requests' (after the warm-up), as every other measure does.
        self.ttft_errors: dict[str, float] = {}
        # Per request id, seconds from its send to its dispatch, with flow control modelled (the
        # time it was held in the gateway's admission queue).
        self.waits: dict[str, float] = {}

    def watch(self, deadline: float, seq: int, engine_id: str) -> bool:
        """Keep the deadline of request `engine_id` (`seq`: the run's count, to order ties). True when
        it is now the point's next alarm (`alarm_at`), for the caller to schedule."""
        timeouts = self.timeouts
        if len(timeouts) > 2 * len(self.open) + 1024:
            # Ended requests' deadlines leave the heap only when the alarm passes them; with a long
            # timeout that is most of a run. Dropping them here keeps the heap O(requests in flight).
            timeouts[:] = [t for t in timeouts if t[2] in self.open]
            heapq.heapify(timeouts)
        heapq.heappush(timeouts, (deadline, seq, engine_id))
        if self.alarm_at is None or deadline < self.alarm_at:
            self.alarm_at = deadline
            return True
        return False

    def overdue(self, now: float) -> list[OpenRequest]:
        """At the alarm `now`: the open requests whose deadline has passed (their deadlines, and
        those of ended requests ahead of the next one, forgotten); `alarm_at` becomes the next
        deadline (None: none left)."""
        timeouts, opened = self.timeouts, self.open
        due = []
        while timeouts and (timeouts[0][0] <= now or timeouts[0][2] not in opened):
            o = opened.get(heapq.heappop(timeouts)[2])
            if o is not None:
                due.append(o)
        self.alarm_at = timeouts[0][0] if timeouts else None
        return due

    def outcome(self, config: DesConfig, replicas: Sequence[SimReplica], queue: EventQueue,
                tokenizer: PromptTokenizer, gateways: Gateways) -> DesResult:  # fmt: skip
        """The point's `DesResult` as of now (see the module docstring)."""
        wall_s = time.perf_counter() - self.wall0
        cpu_s = time.process_time() - self.cpu0
        reports = []
        queries = hits = preemptions = 0
        for rep, before, routed0 in zip(replicas, self.stats0, self.routed0, strict=True):
            now = replica_counters(rep)
            q, h, pre = now[0] - before[0], now[1] - before[1], now[2] - before[2]
            queries += q
            hits += h
            preemptions += pre
            reports.append(ReplicaReport(
                name=rep.name, requests=rep.routed - routed0, prefix_queries_tokens=q, prefix_hits_tokens=h,
                prefix_hit_rate=h / q if q else None, preemptions=pre, generation_tokens=now[3] - before[3],
                steps=now[4] - before[4], busy_s=now[5] - before[5],
            ))  # fmt: skip
        assert self.clients is not None
        warmup_end = self.start + self.load.warmup_s
        errors = self.ttft_errors
        return DesResult(
            config=config,
            load=self.load,
            traces=self.traces,
            warmup_end=warmup_end,
            itl=None if self.record_chunks else self.itl.stats(),
            fleet=FleetDelta(prefix_queries=queries, prefix_hits=hits, preemptions=preemptions),
            replicas=tuple(reports),
            sent=self.clients.dispensed,
            incomplete=self.incomplete,
            events=queue.processed - self.events0,
            wall_s=wall_s,
            cpu_s=cpu_s,
            virtual_s=queue.now - self.start,
            peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            timings=DesTimings(self.workload_s, self.tokenize_s, self.route_s, self.engine_s, self.scrape_s),
            tokens_encoded=tokenizer.tokens_encoded - self.tokens0,
            prompt_tokens=self.prompt_tokens,
            in_flight_skew=SkewStats.of(self.skew),
            gateway_requests=tuple(m.routed - r0 for m, r0 in zip(gateways.models, self.gateway_routed0,
                                                                   strict=True)),
            extra={
                "ttft_prediction_error": prediction_errors(
                    errors[t.request_id] for t in measured(self.traces, warmup_end) if t.request_id in errors
                ),
                **self._flow_figures(config, warmup_end),
            },
        )

    def _flow_figures(self, config: DesConfig, warmup_end: float) -> dict[str, object]:
        """With flow control modelled: the measured requests' waits in the admission queue (those
        dispatched: count, how many waited at all, p50 and p90 in seconds)."""
        if not config.flow_control:
            return {"flow_control": False}
        waits = self.waits
        ordered = sorted(
            waits[t.request_id] for t in measured(self.traces, warmup_end) if t.request_id in waits
        )
        n = len(ordered)
        return {
            "flow_control": True,
            "gateway_wait_s": {
                "n": n,
                "held": sum(1 for w in ordered if w > 0),
                "p50": ordered[(n - 1) // 2] if n else None,
                "p90": ordered[min(n - 1, int(0.9 * n))] if n else None,
            },
        }
