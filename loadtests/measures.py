"""Latency and throughput measures from per-request traces, and the fleet's prefix-cache counters.

Definitions (those of the common serving benchmarks; DESIGN.md "Measuring"). All times are seconds
on one monotonic clock (the runner uses `time.perf_counter()`):

- TTFT: send to the first chunk that carries content (a non-empty `delta.content` or `text`);
- TPOT: (E2E - TTFT) / (output tokens - 1), per request; requests with at most one output token
  have none;
- ITL: every gap between two consecutive content chunks, over all requests (a chunk may carry several
  tokens; the gap is still one sample);
- E2E: send to the end of the response.

Percentiles interpolate linearly between the closest ranks (numpy's default "linear" method): for
sorted values v[0..n-1], the q-th percentile is at rank (n - 1) x q / 100.

Latency distributions cover successful requests only (HTTP 200, a complete stream, no error event).
Warm-up: requests that started before the warm-up end are dropped from every measure. The measured
window runs from the warm-up end to the last measured request's end; output tokens/s, requests/s and
goodput divide by its length. Goodput counts requests that met every SLO threshold that is set; a
failed request never meets an SLO.

Prefix cache hit rate comes from the replicas' own counters (`vllm:prefix_cache_hits_total` and
`..._queries_total`, in tokens), scraped before and after a run: sum over replicas of Δhits divided by
the sum of Δqueries.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtests.slo import Slo


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """What the runner saw of one request. Times are `perf_counter()` seconds.

    `start` is when the request was sent; `first_token` the arrival of the first content chunk (None
    if none came); `end` when the response ended or failed; `chunk_times` the arrival of every content
    chunk, first included. `output_tokens` is the usage chunk's `completion_tokens`, or the number of
    content chunks when the stream had no usage. `prompt_tokens`/`cached_tokens` come from usage (None
    if absent). `status` is the HTTP status (0 when no response came); `error` is None on success, else
    `"<kind>: <detail>"` with kind one of `http`, `stream-error`, `connection`, `timeout`, `incomplete`.
    `replica` is the `x-kvgate-replica` response header when present.
    """

    request_id: str
    tenant: str | None
    group: str | None
    start: float
    first_token: float | None
    end: float
    chunk_times: list[float]
    output_tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None
    status: int
    error: str | None
    replica: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1): seconds per output token after the first."""
        if self.first_token is None or self.output_tokens <= 1:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.chunk_times)]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of ascending `sorted_values` by linear interpolation
    between closest ranks. ValueError when empty."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    rank = (n - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Summary of one latency in seconds; every figure None when `count` is 0."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> LatencyStats:
        v = sorted(values)
        if not v:
            return cls(0, None, None, None, None, None)
        p50, p90, p95, p99 = (percentile(v, q) for q in (50, 90, 95, 99))
        return cls(len(v), sum(v) / len(v), p50, p90, p95, p99)


def meets_slo(trace: RequestTrace, slo: Slo) -> bool:
    """True when the request succeeded and every threshold set in `slo` holds: TTFT, TPOT (skipped
    for requests without one, i.e. at most one output token), E2E, and ITL as the request's largest
    gap between content chunks."""
    if not trace.ok:
        return False
    if slo.ttft_s is not None:
        ttft = trace.ttft
        if ttft is None or ttft > slo.ttft_s:
            return False
    if slo.tpot_s is not None:
        tpot = trace.tpot
        if tpot is not None and tpot > slo.tpot_s:
            return False
    if slo.e2e_s is not None and trace.e2e > slo.e2e_s:
        return False
    if slo.itl_s is not None:
        gaps = trace.itls()
        if gaps and max(gaps) > slo.itl_s:
            return False
    return True


@dataclass(frozen=True, slots=True)
class TenantMeasures:
    """One tenant's share of a run. Rates are per second of the whole measured window; shares are
    fractions of all measured requests (`offered_share`) and of all successful output tokens
    (`served_share`)."""

    requests: int
    completed: int
    errors: int
    status_429: int
    ttft: LatencyStats
    e2e: LatencyStats
    output_tok_s: float
    goodput_rps: float
    offered_share: float
    served_share: float

    def as_dict(self) -> dict[str, Any]:
        """Flat JSON form, the `per_tenant` values of a results record (seconds, per second, fractions)."""
        return {
            "requests": self.requests,
            "completed": self.completed,
            "errors": self.errors,
            "status_429": self.status_429,
            "ttft_p50_s": self.ttft.p50,
            "ttft_p90_s": self.ttft.p90,
            "ttft_p95_s": self.ttft.p95,
            "ttft_p99_s": self.ttft.p99,
            "e2e_p90_s": self.e2e.p90,
            "output_tok_s": self.output_tok_s,
            "goodput_rps": self.goodput_rps,
            "offered_share": self.offered_share,
            "served_share": self.served_share,
        }


@dataclass(frozen=True, slots=True)
class Measures:
    """The measures of one run (one policy x workload x load point) over its measured window.

    `requests` counts measured requests (started after warm-up), failed ones included; `completed`
    the successful ones. Rates are per second of `duration_s`. `cached_token_fraction` is
    sum(cached_tokens) / sum(prompt_tokens) over successful requests whose usage reported both (None
    when none did): the replicas' own view of prefix hits, per request.
    """

    requests: int
    completed: int
    errors: int
    status_429: int
    status_503: int
    error_kinds: dict[str, int]
    duration_s: float
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    output_tokens: int
    output_tok_s: float
    requests_s: float
    goodput_rps: float
    goodput_tok_s: float
    cached_token_fraction: float | None
    per_tenant: dict[str, TenantMeasures] = field(default_factory=dict)


NO_TENANT = "(none)"


def measured(traces: Iterable[RequestTrace], warmup_end: float) -> list[RequestTrace]:
    """The traces of requests that started at or after `warmup_end` (seconds, the traces' clock)."""
    return [t for t in traces if t.start >= warmup_end]


def summarize(traces: Iterable[RequestTrace], *, warmup_end: float, slo: Slo | None = None) -> Measures:
    """Measures over the requests that started at or after `warmup_end`. Without an SLO, goodput equals
    throughput (every successful request counts)."""
    kept = measured(traces, warmup_end)
    window_end = max((t.end for t in kept), default=warmup_end)
    duration = max(window_end - warmup_end, 0.0)
    rate = (1.0 / duration) if duration > 0 else 0.0
    ok = [t for t in kept if t.ok]
    good = [t for t in ok if slo is None or meets_slo(t, slo)]
    output_tokens = sum(t.output_tokens for t in ok)
    kinds = Counter(t.error.partition(":")[0] for t in kept if t.error is not None)
    kinds.update("http" for t in kept if t.error is None and t.status != 200)
    with_usage = [t for t in ok if t.prompt_tokens and t.cached_tokens is not None]
    prompt_sum = sum(t.prompt_tokens or 0 for t in with_usage)
    return Measures(
        requests=len(kept),
        completed=len(ok),
        errors=len(kept) - len(ok),
        status_429=sum(1 for t in kept if t.status == 429),
        status_503=sum(1 for t in kept if t.status == 503),
        error_kinds=dict(sorted(kinds.items())),
        duration_s=duration,
        ttft=LatencyStats.of(t.first_token - t.start for t in ok if t.first_token is not None),
        tpot=LatencyStats.of(v for v in (t.tpot for t in ok) if v is not None),
        itl=LatencyStats.of(gap for t in ok for gap in t.itls()),
        e2e=LatencyStats.of(t.end - t.start for t in ok),
        output_tokens=output_tokens,
        output_tok_s=output_tokens * rate,
        requests_s=len(ok) * rate,
        goodput_rps=len(good) * rate,
        goodput_tok_s=sum(t.output_tokens for t in good) * rate,
        cached_token_fraction=(
            sum(t.cached_tokens or 0 for t in with_usage) / prompt_sum if prompt_sum else None
        ),
        per_tenant=_per_tenant(kept, good, rate, output_tokens),
    )


def _per_tenant(
    kept: list[RequestTrace], good: list[RequestTrace], rate: float, output_tokens: int
) -> dict[str, TenantMeasures]:
    if all(t.tenant is None for t in kept):
        return {}
    by_tenant: dict[str, list[RequestTrace]] = {}
    for t in kept:
        by_tenant.setdefault(t.tenant or NO_TENANT, []).append(t)
    good_count = Counter(t.tenant or NO_TENANT for t in good)
    out: dict[str, TenantMeasures] = {}
    for name in sorted(by_tenant):
        rows = by_tenant[name]
        ok = [t for t in rows if t.ok]
        tokens = sum(t.output_tokens for t in ok)
        out[name] = TenantMeasures(
            requests=len(rows),
            completed=len(ok),
            errors=len(rows) - len(ok),
            status_429=sum(1 for t in rows if t.status == 429),
            ttft=LatencyStats.of(t.first_token - t.start for t in ok if t.first_token is not None),
            e2e=LatencyStats.of(t.end - t.start for t in ok),
            output_tok_s=tokens * rate,
            goodput_rps=good_count[name] * rate,
            offered_share=len(rows) / len(kept),
            served_share=tokens / output_tokens if output_tokens else 0.0,
        )
    return out


@dataclass(frozen=True, slots=True)
class LoadgenUsage:
    """The load generator's own CPU over a run: `cpu_s` CPU seconds (user + system) of the generator
    over `wall_s` seconds of wall time, for `requests` requests sent. `cpu_frac` is in cores
    (1.0 = one core busy all the time); above `BOTTLENECK_CPU_FRAC` the generator, not the server, may
    be setting the pace, and the run's latencies are suspect."""

    cpu_s: float
    wall_s: float
    requests: int

    BOTTLENECK_CPU_FRAC = 0.8

    @property
    def cpu_frac(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        return 1e3 * self.cpu_s / self.requests if self.requests else 0.0

    @property
    def bottleneck(self) -> bool:
        return self.cpu_frac > self.BOTTLENECK_CPU_FRAC


# --- the fleet's counters -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """One replica's cumulative counters from `/metrics`, summed over engines and label sets.
    Prefix figures are in tokens; preemptions in requests."""

    prefix_queries: float
    prefix_hits: float
    preemptions: float


@dataclass(frozen=True, slots=True)
class FleetDelta:
    """Counter increases over a run, summed over replicas."""

    prefix_queries: float
    prefix_hits: float
    preemptions: float

    @property
    def prefix_hit_rate(self) -> float | None:
        """Δhits / Δqueries in [0, 1]; None when no prefix lookup happened."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries > 0 else None


# New names first; vLLM before 0.10 wrote the gpu_ ones. A replica is read under one naming only.
_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
_PREEMPTIONS = ("vllm:num_preemptions_total",)
_WANTED = frozenset(_QUERIES + _HITS + _PREEMPTIONS)


def parse_replica_counters(metrics_text: str) -> ReplicaCounters:
    """Read the prefix-cache and preemption counters from one replica's Prometheus text. Absent
    counters read as 0 (a replica without prefix caching reports no queries)."""
    sums: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        name = line[: brace if brace != -1 and (space == -1 or brace < space) else space]
        if name not in _WANTED:
            continue
        # Label values may hold spaces: the value follows the closing brace.
        rest = line[line.rfind("}") + 1 :] if brace != -1 else line[len(name) :]
        sums[name] = sums.get(name, 0.0) + float(rest.split()[0])

    def first_present(names: tuple[str, ...]) -> float:
        return next((sums[n] for n in names if n in sums), 0.0)

    return ReplicaCounters(
        prefix_queries=first_present(_QUERIES),
        prefix_hits=first_present(_HITS),
        preemptions=first_present(_PREEMPTIONS),
    )


def _increase(before: float | None, after: float) -> float:
    # A counter below its earlier value was reset (replica restart): all of `after` is new.
    if before is None or after < before:
        return after
    return after - before


def fleet_delta(before: Mapping[str, ReplicaCounters], after: Mapping[str, ReplicaCounters]) -> FleetDelta:
    """Counter increases between two scrapes keyed by replica. A replica only in `after` counts from
    zero; one only in `before` (gone) is skipped; a counter that went down was reset and counts from
    zero."""
    queries = hits = preemptions = 0.0
    for replica, a in after.items():
        b = before.get(replica)
        queries += _increase(b.prefix_queries if b else None, a.prefix_queries)
        hits += _increase(b.prefix_hits if b else None, a.prefix_hits)
        preemptions += _increase(b.preemptions if b else None, a.preemptions)
    return FleetDelta(prefix_queries=queries, prefix_hits=hits, preemptions=preemptions)


def prefix_hit_rate(
    before: Mapping[str, ReplicaCounters], after: Mapping[str, ReplicaCounters]
) -> float | None:
    """Sum over replicas of Δhits / sum of Δqueries (tokens); None when there were no queries."""
    return fleet_delta(before, after).prefix_hit_rate


def prediction_errors(errors: Iterable[float]) -> dict[str, float | int | None]:
    """|predicted - actual| / actual TTFT of a point's streams, as kvgate's latency model scored
    them (the DES's gateways, or a live gateway's access log): count, p50, p90 (nearest rank)."""
    ordered = sorted(errors)
    if not ordered:
        return {"n": 0, "p50": None, "p90": None}
    n = len(ordered)
    return {"n": n, "p50": ordered[(n - 1) // 2], "p90": ordered[min(n - 1, int(0.9 * n))]}
