"""What a what-if run produced: `DesResult` (traces, fleet counters, the run's own figures) and its record.

Shapes are the live runner's: `RequestTrace`s in, `loadtests.measures.Measures` and a
`loadtests.results` record out, so the report puts live and simulated runs side by side. The record
gets two extra keys (the schema allows them): `driver: "des"` and `des`, the run's own figures
(`DesResult.des_figures`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from loadtests.des.config import DesConfig
from loadtests.measures import (
    FleetDelta,
    LatencyStats,
    LoadgenUsage,
    Measures,
    RequestTrace,
    percentile,
    summarize,
)
from loadtests.results import make_record
from loadtests.runner import LoadConfig
from loadtests.slo import Slo


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One replica over the run: requests routed to it, its engine's counters (prefix figures in
    tokens, `busy_s` virtual seconds in steps), and `prefix_hit_rate` = hits / queries (None when
    it had no lookups)."""

    name: str
    requests: int
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    prefix_hit_rate: float | None
    preemptions: int
    generation_tokens: int
    steps: int
    busy_s: float


@dataclass(frozen=True, slots=True)
class DesTimings:
    """Where the run's wall time went (seconds of `perf_counter`; the rest is the event loop itself)."""

    workload_s: float  # pulling specs from the workload (its text generation)
    tokenize_s: float  # prompts to token ids
    route_s: float  # request info + routing decision + dispatch bookkeeping
    engine_s: float  # engine steps (including admission)
    scrape_s: float  # engine stats + FleetState.record_scrape


@dataclass(frozen=True, slots=True)
class SkewStats:
    """The fleet's in-flight skew over a run: at each dispatch, the busiest replica's true in-flight
    count (every gateway's requests) minus the fleet's mean, in requests. Herding shows as a high
    p99 and max: gateways that cannot see each other's dispatches piling onto one replica between
    scrapes. All None when nothing was dispatched."""

    samples: int
    mean: float | None
    p50: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, samples: list[float]) -> SkewStats:
        if not samples:
            return cls(0, None, None, None, None)
        ordered = sorted(samples)
        mean = sum(ordered) / len(ordered)
        return cls(len(ordered), mean, percentile(ordered, 50), percentile(ordered, 99), ordered[-1])

    def as_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "mean": self.mean, "p50": self.p50, "p99": self.p99, "max": self.max}


@dataclass(frozen=True, slots=True)
class DesResult:
    """One simulated load point. Times in traces are virtual seconds from 0; `warmup_end` likewise.

    `itl` is the inter-token gap summary when traces carry no chunk times (else None: `summarize`
    computes it from the traces). `sent` counts requests sent, `incomplete` those cut at the drain
    deadline (not in `traces`). `events` counts processed events; `wall_s`/`cpu_s` are the run's
    wall and process CPU seconds; `virtual_s` the simulated span; `peak_rss_bytes` the process's peak
    resident memory at the end (it includes whatever the process held before the run).
    `in_flight_skew` measures herding (`SkewStats`); `gateway_requests` counts the requests each
    gateway routed.
    """

    config: DesConfig
    load: LoadConfig
    traces: list[RequestTrace]
    warmup_end: float
    itl: LatencyStats | None
    fleet: FleetDelta
    replicas: tuple[ReplicaReport, ...]
    sent: int
    incomplete: int
    events: int
    wall_s: float
    cpu_s: float
    virtual_s: float
    peak_rss_bytes: int
    timings: DesTimings
    tokens_encoded: int
    prompt_tokens: int
    in_flight_skew: SkewStats = SkewStats(0, None, None, None, None)
    gateway_requests: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0

    def summarize(self, slo: Slo | None = None) -> Measures:
        """`loadtests.measures.summarize` over the traces, with the ITL from the run's histogram when
        the traces carry no chunk times."""
        if slo is not None and slo.itl_s is not None and self.itl is not None:
            raise ValueError("an ITL SLO needs chunk times: run with record_chunks=True")
        measures = summarize(self.traces, warmup_end=self.warmup_end, slo=slo)
        return measures if self.itl is None else replace(measures, itl=self.itl)

    def des_figures(self) -> dict[str, Any]:
        """The run's own figures, for the `des` object of its results record (JSON-ready)."""
        rates = [r.prefix_hit_rate for r in self.replicas if r.prefix_hit_rate is not None]
        t = self.timings
        return {
            "driver": "des",
            "replicas": len(self.replicas),
            "profile": self.config.fleet.profile,
            "requests_sent": self.sent,
            "events": self.events,
            "events_per_s": self.events_per_s,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "virtual_s": self.virtual_s,
            "peak_rss_mb": self.peak_rss_bytes / 2**20,
            "gateway_overhead_s": self.config.gateway_overhead_s,
            "gateways": self.config.views.gateways,
            "views": {"spread": self.config.views.spread, "ledger": self.config.views.ledger,
                      "scrape_phases": self.config.views.scrape_phases,
                      "scrape_delay_s": self.config.views.scrape_delay_s, "index": self.config.views.index,
                      "event_lag_s": self.config.views.event_lag_s},
            "gateway_requests": list(self.gateway_requests),
            "in_flight_skew": self.in_flight_skew.as_dict(),
            "chunk_times": self.itl is None,
            "prompt_tokens": self.prompt_tokens,
            "tokens_encoded": self.tokens_encoded,
            "timings_s": {
                "workload": t.workload_s, "tokenize": t.tokenize_s, "route": t.route_s,
                "engine": t.engine_s, "scrape": t.scrape_s,
            },
            "replica_hit_rate_min": min(rates) if rates else None,
            "replica_hit_rate_max": max(rates) if rates else None,
            "per_replica": [
                {"name": r.name, "requests": r.requests, "prefix_hit_rate": r.prefix_hit_rate,
                 "preemptions": r.preemptions, "busy_s": r.busy_s}
                for r in self.replicas
            ],
            **self.extra,
        }

    def to_record(
        self, *, workload: str, slo: Slo | None = None, policy: str | None = None
    ) -> dict[str, Any]:
        """The results record of this run: `make_record`'s fields (the load generator's are zero:
        simulated arrivals cost no client CPU), plus `driver: "des"` and the `des` figures."""
        load = self.load
        record = make_record(
            policy=policy or self.config.policy,
            workload=workload,
            measures=self.summarize(slo),
            loadgen=LoadgenUsage(cpu_s=0.0, wall_s=self.wall_s, requests=self.sent),
            concurrency=load.concurrency,
            rate=load.rate,
            burstiness=load.burstiness,
            warmup_s=load.warmup_s,
            incomplete=self.incomplete,
            fleet=self.fleet,
        ).as_dict()
        record["driver"] = "des"
        record["des"] = self.des_figures()
        return record
