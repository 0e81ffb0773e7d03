"""Per-variant metrics: every request for a route, labelled with the route and the target that served it.

Only these families carry `route` and `target` (values from config, so the series are bounded by it:
routes x targets x {false, true} for `shadow`); the model-level families in gateway/metrics.py keep
their labels. A shadow (mirror) request is counted here with `shadow="true"` and nowhere else.

    kvgate_route_requests_total{route,target,status,shadow}   answered, by HTTP status (499: client left)
    kvgate_route_errors_total{route,target,shadow}            5xx, or a stream that broke after it began
    kvgate_route_time_to_first_token_seconds{route,target,shadow}
    kvgate_route_inter_chunk_latency_seconds{route,target,shadow}
    kvgate_route_request_duration_seconds{route,target,shadow}
    kvgate_route_tokens_total{route,target,shadow,kind}       prompt, completion, cached (replica usage)
    kvgate_route_in_flight{route,target,shadow}               begun and not yet ended (scrape time)
    kvgate_route_mirror_dropped_total{route,reason}           saturated, concurrency, unavailable, shutdown
    kvgate_adapter_loads_total{target,outcome} / kvgate_adapter_unloads_total{target,outcome}

Children are looked up once per label set and kept (labels() costs a lock and a dict lookup). The
inter-chunk histogram is observed on every relayed chunk, so it is not a prometheus_client
Histogram (a lock per bucket and a linear scan of the bounds, ~1-2 µs): each arm keeps plain bucket
counts (`Gaps`, one bisect and two additions per chunk, one event loop, no lock), exported at scrape
time.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from gateway.forwarder import Outcome
from gateway.metrics import ITL_BUCKETS, LATENCY_BUCKETS, GatewayMetrics

Key = tuple[str, str, bool]  # route, target, shadow


class Gaps:
    """A histogram of inter-chunk gaps (seconds) over `ITL_BUCKETS`, owned by one event loop:
    `counts[i]` gaps fell at or below `ITL_BUCKETS[i]` and above the bound before (the last: above
    every bound); `total` is their sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(ITL_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, gap: float) -> None:
        self.counts[bisect_left(ITL_BUCKETS, gap)] += 1
        self.total += gap

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative, as the exposition format wants them (`+Inf` last)."""
        out, running = [], 0
        for bound, n in zip((*map(str, ITL_BUCKETS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, float(running)))
        return out


@dataclass(slots=True)
class _Arm:
    ttft: Any
    itl: Gaps
    e2e: Any
    errors: Any
    prompt: Any
    completion: Any
    cached: Any


class RouteMetrics:
    """The per-variant families on a Gateway's registry; one event loop."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        registry = metrics.registry
        labels = ["route", "target", "shadow"]
        self.requests = Counter(
            "kvgate_route_requests", "Requests for a route, by the target that served it, HTTP status "
            "and whether it was a shadow copy.", [*labels[:2], "status", "shadow"], registry=registry,
        )  # fmt: skip
        self.errors = Counter(
            "kvgate_route_errors", "Requests for a route that failed (5xx, or a stream broken after it "
            "began), by target.", labels, registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "kvgate_route_time_to_first_token_seconds", "Arrival to the first byte of the answer, by "
            "route and target (shadow: from the copy's dispatch).", labels, buckets=LATENCY_BUCKETS,
            registry=registry,
        )  # fmt: skip
        self.e2e = Histogram(
            "kvgate_route_request_duration_seconds", "Arrival to the last byte of the answer, by route and "
            "target.", labels, buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "kvgate_route_tokens", "Tokens by route, target and kind (prompt, completion, cached), from "
            "the replicas' usage.", [*labels, "kind"], registry=registry,
        )  # fmt: skip
        self.mirror_dropped = Counter(
            "kvgate_route_mirror_dropped", "Shadow copies not sent, by route and reason (saturated, "
            "concurrency, unavailable, shutdown).", ["route", "reason"], registry=registry,
        )  # fmt: skip
        self.adapter_loads = Counter(
            "kvgate_adapter_loads", "Adapter loads kvgate asked a replica for, by target and outcome "
            "(ok, failed).", ["target", "outcome"], registry=registry,
        )  # fmt: skip
        self.adapter_unloads = Counter(
            "kvgate_adapter_unloads", "Adapters kvgate unloaded to stay within max_adapters_per_replica, "
            "by target and outcome.", ["target", "outcome"], registry=registry,
        )  # fmt: skip
        self._arms: dict[Key, _Arm] = {}
        self._status: dict[tuple[str, str, bool, int], Any] = {}
        self.in_flight: dict[Key, int] = {}
        metrics.add_callback(self._collect)

    def arm(self, route: str, target: str, shadow: bool) -> _Arm:
        key = (route, target, shadow)
        a = self._arms.get(key)
        if a is None:
            s = "true" if shadow else "false"
            t = self.tokens
            a = self._arms[key] = _Arm(
                self.ttft.labels(route, target, s), Gaps(),
                self.e2e.labels(route, target, s), self.errors.labels(route, target, s),
                t.labels(route, target, s, "prompt"), t.labels(route, target, s, "completion"),
                t.labels(route, target, s, "cached"),
            )  # fmt: skip
        return a

    def begin(self, route: str, target: str, shadow: bool = False) -> None:
        key = (route, target, shadow)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1

    def end(self, route: str, target: str, shadow: bool = False) -> None:
        key = (route, target, shadow)
        self.in_flight[key] = max(0, self.in_flight.get(key, 0) - 1)

    def itl_observer(self, route: str, target: str, also: Callable[[float], None]) -> Callable[[float], None]:
        """One callable for the forwarder's per-gap hook: the model's histogram and the arm's."""
        mine = self.arm(route, target, False).itl.observe

        def observe(gap: float) -> None:
            also(gap)
            mine(gap)

        return observe

    def done(self, route: str, target: str, shadow: bool, status: int, t0: float, out: Outcome) -> None:
        """A request for `route` served by `target` ended with `status`; `t0` is its start
        (perf_counter), `out` what the forwarder got done. Ends what `begin` began."""
        self.end(route, target, shadow)
        if out.slow_client:
            status = 499  # kvgate dropped a client that stopped reading: the client's doing
        a = self.arm(route, target, shadow)
        c = self._status.get((route, target, shadow, status))
        if c is None:
            c = self._status[(route, target, shadow, status)] = self.requests.labels(
                route, target, str(status), "true" if shadow else "false"
            )
        c.inc()
        if status >= 500 or (status == 200 and out.error_kind is not None):
            a.errors.inc()
        if out.first_byte_at is not None:
            a.ttft.observe(out.first_byte_at - t0)
            if out.ended_at is not None:
                a.e2e.observe(out.ended_at - t0)
        u = out.usage
        if u is not None:
            a.prompt.inc(u.prompt_tokens)
            a.completion.inc(u.completion_tokens)
            a.cached.inc(u.cached_tokens)

    def _collect(self) -> Iterable[Metric]:
        gaps = HistogramMetricFamily(
            "kvgate_route_inter_chunk_latency_seconds", "Gap between two relayed stream chunks, by route "
            "and target.", labels=["route", "target", "shadow"],
        )  # fmt: skip
        for (route, target, shadow), arm in self._arms.items():
            gaps.add_metric([route, target, "true" if shadow else "false"], arm.itl.buckets(), arm.itl.total)
        yield gaps
        fam = GaugeMetricFamily(
            "kvgate_route_in_flight", "Requests for a route begun and not yet ended, by target.",
            labels=["route", "target", "shadow"],
        )  # fmt: skip
        for (route, target, shadow), n in self.in_flight.items():
            fam.add_metric([route, target, "true" if shadow else "false"], n)
        yield fam

    def summary(self, route: str) -> dict[str, dict[str, Any]]:
        """Per target of `route` (primary and shadow apart): requests by status, errors, in flight,
        tokens, TTFT and duration mean / p50 / p90 (from the histograms' buckets: upper bounds)."""
        out: dict[str, dict[str, Any]] = {}

        def entry(target: str, shadow: str) -> dict[str, Any]:
            d = out.setdefault(target, {})
            side = "shadow" if shadow == "true" else "primary"
            if side not in d:
                d[side] = {"requests": {}, "errors": 0, "in_flight": 0, "tokens": {}}
                d[side].update(ttft_s={}, duration_s={})
            e: dict[str, Any] = d[side]
            return e

        for (r, target, is_shadow), n in self.in_flight.items():
            if r == route:
                entry(target, "true" if is_shadow else "false")["in_flight"] = n
        for counter in (self.requests, self.errors, self.tokens):
            for metric in counter.collect():
                for s in metric.samples:
                    if s.labels.get("route") != route or not s.name.endswith("_total"):
                        continue
                    e = entry(s.labels["target"], s.labels["shadow"])
                    if "status" in s.labels:
                        e["requests"][s.labels["status"]] = int(s.value)
                    elif "kind" in s.labels:
                        e["tokens"][s.labels["kind"]] = int(s.value)
                    else:
                        e["errors"] = int(s.value)
        for hist, name in ((self.ttft, "ttft_s"), (self.e2e, "duration_s")):
            for metric in hist.collect():
                per: dict[tuple[str, str], list[Any]] = {}
                for s in metric.samples:
                    if s.labels.get("route") == route:
                        per.setdefault((s.labels["target"], s.labels["shadow"]), []).append(s)
                for (target, shadow), samples in per.items():
                    entry(target, shadow)[name] = _latency(samples)
        return out


def _latency(samples: list[Any]) -> dict[str, float | None]:
    count = next((s.value for s in samples if s.name.endswith("_count")), 0.0)
    total = next((s.value for s in samples if s.name.endswith("_sum")), 0.0)
    buckets = sorted((float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket"))

    def quantile(q: float) -> float | None:
        if not count:
            return None
        for le, n in buckets:
            if n >= q * count:
                return le if math.isfinite(le) else None
        return None

    return {
        "count": count,
        "mean": total / count if count else None,
        "p50": quantile(0.5),
        "p90": quantile(0.9),
    }
