"""kvgate's own Prometheus metrics (`kvgate_` prefix), on a registry owned by one Gateway.

Label values come from config (model pools, replica and tenant names) or from small fixed sets
(status classes, error kinds); a model name a client invents is recorded as "unknown", so clients
cannot blow up the series count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1)
RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


class _CallbackCollector(Collector):
    """Gauges computed at scrape time (scrape ages, index size) instead of on every change."""

    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self._produce = produce

    def collect(self) -> Iterable[Metric]:
        return self._produce()


class ModelChildren(NamedTuple):
    ttft: Any
    itl: Any
    e2e: Any


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "kvgate_requests", "Requests answered, by model and HTTP status.", ["model", "status"], registry=r
        )
        self.ttft = Histogram(
            "kvgate_time_to_first_token_seconds",
            "Gateway-measured time from request arrival to the first byte of the answer "
            "(includes queueing at the gateway).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "kvgate_inter_chunk_latency_seconds",
            "Gap between two relayed stream chunks.",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "kvgate_request_duration_seconds",
            "Request arrival to the last byte of the answer.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "kvgate_tokens",
            "Tokens by model, tenant and kind (prompt, completion, cached), from the replicas' usage.",
            ["model", "tenant", "kind"],
            registry=r,
        )
        self.decisions = Counter(
            "kvgate_routing_decisions", "Requests dispatched, by replica.", ["replica"], registry=r
        )
        self.decision_seconds = Histogram(
            "kvgate_scheduling_decision_seconds",
            "Time to pick a replica: prefix match, filters, scorers and picker.",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.prefix_match = Histogram(
            "kvgate_prefix_match_ratio",
            "Share of the prompt's leading index blocks the chosen replica was believed to hold.",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.ttft_prediction_error = Histogram(
            "kvgate_ttft_prediction_error_ratio",
            "|predicted - actual| / actual of the time from dispatch to a stream's first chunk, by "
            "replica and pool: how well the predicted-latency model knows each replica.",
            ["replica", "pool"],
            buckets=(0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.retries = Counter(
            "kvgate_retries", "Requests retried on another replica, by reason.", ["reason"], registry=r
        )
        self.upstream_errors = Counter(
            "kvgate_upstream_errors",
            "Upstream failures by replica and kind (connect, timeout, status_5xx, stream_broken).",
            ["replica", "kind"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "kvgate_client_disconnects", "Clients that went away before the answer ended.", registry=r
        )
        self.slow_clients = Counter(
            "kvgate_slow_clients",
            "Answers kvgate cut short because the client took nothing for server.send_timeout_s "
            "(recorded with status 499; the replica is not blamed).",
            registry=r,
        )
        self.in_flight = Gauge("kvgate_requests_in_flight", "Requests being answered right now.", registry=r)
        self._tenant_metrics(r)
        self._quota_metrics(r)

    def _tenant_metrics(self, r: CollectorRegistry) -> None:
        """Tenants, rate limits and flow control. Queue depth, bucket levels and per-tenant in-flight
        counts are gauges computed at scrape time (`add_callback`) by the tenancy layer."""
        self.admissions = Counter(
            "kvgate_admissions",
            "Requests admitted, by tenant, band and path (direct: the pool had room; queued: waited).",
            ["tenant", "band", "path"],
            registry=r,
        )
        self.rejections = Counter(
            "kvgate_rejections",
            "Requests refused by tenancy or flow control, by tenant and reason (unauthenticated, "
            "model_not_allowed, bad_priority, concurrency, rate_limit_requests, rate_limit_tokens, "
            "too_large, store_unavailable, shed, queue_full, tenant_queue_full, queue_timeout, "
            "draining).",
            ["tenant", "reason"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "kvgate_queue_wait_seconds",
            "Time requests spent in the admission queue, by tenant, band and how they left it "
            "(dispatched, timeout, cancelled). Requests that never queued are not observed.",
            ["tenant", "band", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens_charged = Counter(
            "kvgate_tenant_tokens_charged",
            "Tokens charged to each tenant's token bucket after settling (real usage, or the "
            "documented estimate when the replica sent none).",
            ["tenant"],
            registry=r,
        )
        self.store_errors = Counter(
            "kvgate_state_store_errors",
            "Failed calls to the rate limit state store (Redis), by operation.",
            ["op"],
            registry=r,
        )
        self.store_up = Gauge(
            "kvgate_state_store_up",
            "1 while the rate limit store (Redis) answers; 0 while its failure mode applies.",
            registry=r,
        )
        self.settles_dropped = Counter(
            "kvgate_state_settles_dropped",
            "Settles of Redis reservations dropped because Redis was unreachable (the reservation "
            "stays charged).",
            registry=r,
        )

        # labels() costs a lock and a dict lookup each time; the request path asks the same few
        # children over and over, so they are looked up once per label set and kept.
        self._by_model: dict[str, ModelChildren] = {}
        self._status: dict[tuple[str, int], Any] = {}
        self._tokens: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._replica: dict[str, Any] = {}

    def _quota_metrics(self, r: CollectorRegistry) -> None:
        """Quotas, the usage ledger and the admin API. Quota use and the ledger's pending records are
        gauges computed at scrape time by their owners."""
        self.quota_warnings = Counter(
            "kvgate_quota_warnings",
            "Quotas whose warn_at level was crossed, once per window across the gateways sharing the "
            "store (counted by the gateway that crossed it), by tenant, key (- for the tenant's own) "
            "and quota.",
            ["tenant", "key", "quota"],
            registry=r,
        )
        self.ledger_flushes = Counter(
            "kvgate_ledger_flushes", "Batches of settled usage written to the ledger store.", registry=r
        )
        self.ledger_flush_errors = Counter(
            "kvgate_ledger_flush_errors",
            "Ledger flushes that failed (the batch is kept and retried; nothing is dropped).",
            registry=r,
        )
        self.admin_calls = Counter(
            "kvgate_admin_calls",
            "Admin API calls, by admin key name (unknown: refused before one was known), method and status.",
            ["admin", "method", "status"],
            registry=r,
        )
        self.policy_syncs = Counter(
            "kvgate_policy_syncs",
            "Times this gateway reloaded the admin API's changes from the store, by why (message, "
            "resync, change).",
            ["reason"],
            registry=r,
        )

    def for_model(self, model: str) -> ModelChildren:
        c = self._by_model.get(model)
        if c is None:
            c = self._by_model[model] = ModelChildren(
                self.ttft.labels(model), self.itl.labels(model), self.e2e.labels(model)
            )
        return c

    def request_done(self, model: str, status: int) -> None:
        c = self._status.get((model, status))
        if c is None:
            c = self._status[(model, status)] = self.requests.labels(model, str(status))
        c.inc()

    def tokens_used(self, model: str, tenant: str, prompt: int, completion: int, cached: int) -> None:
        c = self._tokens.get((model, tenant))
        if c is None:
            c = self._tokens[(model, tenant)] = (
                self.tokens.labels(model, tenant, "prompt"),
                self.tokens.labels(model, tenant, "completion"),
                self.tokens.labels(model, tenant, "cached"),
            )
        c[0].inc(prompt)
        c[1].inc(completion)
        c[2].inc(cached)

    def dispatched_to(self, replica: str) -> None:
        c = self._replica.get(replica)
        if c is None:
            c = self._replica[replica] = self.decisions.labels(replica)
        c.inc()

    def forget_replica(self, replica: str) -> None:
        """Drop a replica's per-replica series that this class keeps (it left the fleet): pods come
        and go under new names, and each name's series would otherwise stay forever."""
        if self._replica.pop(replica, None) is not None:
            self.decisions.remove(replica)

    def add_callback(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_CallbackCollector(produce))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def gauge_family(name: str, doc: str, label: str, values: Iterable[tuple[str, float]]) -> Metric:
    fam = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in values:
        fam.add_metric([key], value)
    return fam
