"""vLLM's /metrics for one simulated replica, plus the simulator's own `kvgate_sim_*` series.

Names, types, labels, help texts and histogram buckets follow vLLM 0.32's captures. Gauges and the
engine's cumulative token counters are read live from the engine's stats at scrape time; per-request
histograms are plain bucket arrays updated by the driver (no locks, one bisect per observation, and one
call for a whole step's worth of equal inter-token gaps). One `CollectorRegistry` per replica.

Every latency here is in SIMULATED seconds (the engine clock); `kvgate_sim_time_scale` says how many wall
seconds one simulated second took. `kvgate_sim_step_lag_seconds` is in WALL seconds: how late engine steps
started versus their deadline because the simulator's own CPU was busy, i.e. how far its timings are
distorted. It is the simulator's own metric, not vLLM's.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class StatsLike(Protocol):
    """What the metrics read from the engine's stats (the engine's `EngineStats` satisfies it)."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_cache_usage(self) -> float: ...
    @property
    def prefix_cache_queries_tokens(self) -> int: ...
    @property
    def prefix_cache_hits_tokens(self) -> int: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def generation_tokens(self) -> int: ...
    @property
    def running_adapters(self) -> Sequence[str]: ...
    @property
    def waiting_adapters(self) -> Sequence[str]: ...


class BucketHistogram:
    """A histogram's state: counts per bucket (non-cumulative), sum, creation time. Not thread-safe."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float], created: float) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.created = created

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_n(self, value: float, n: int) -> None:
        """`n` observations of the same value in one call (a step's equal inter-token gaps)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)


class ReplicaMetrics:
    """The metric state of one replica and its Prometheus collector.

    Owned by the replica; the driver calls `record_finished`, `observe_step` and `note_lora` from the
    replica's event loop, and `render()` runs on the same loop, so no locks.
    `stats` returns the engine's live stats; `slowdown` returns the current slowdown fault.
    """

    def __init__(
        self,
        model_name: str,
        stats: Callable[[], StatsLike],
        *,
        cache_config: Mapping[str, str],
        max_loras: int,
        time_scale: float,
        slowdown: Callable[[], float] = lambda: 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._stats = stats
        self._slowdown = slowdown
        self._wall = wall_clock
        self._labels = {"engine": "0", "model_name": model_name}
        self._cache_labels = {"engine": "0", **cache_config}
        self._max_loras = max_loras
        self._time_scale = time_scale
        self.created = created = wall_clock()
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = BucketHistogram(TTFT_BUCKETS, created)
        self.itl = BucketHistogram(ITL_BUCKETS, created)
        self.e2e = BucketHistogram(REQUEST_LATENCY_BUCKETS, created)
        self.queue = BucketHistogram(REQUEST_LATENCY_BUCKETS, created)
        self.step_lag = BucketHistogram(STEP_LAG_BUCKETS, created)
        self.steps = 0
        self.busy_wall_seconds = 0.0
        self.clock_jump_seconds = 0.0
        self._lora: dict[tuple[str, str], float] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]

    # -- updates (driver) ------------------------------------------------------------------------------

    def record_finished(self, reason: str, arrival: float, first_scheduled: float | None,
                        first_token: float | None, finished: float) -> None:
        """One finished request; times in simulated seconds on the engine clock."""
        self.success[reason] = self.success.get(reason, 0) + 1
        self.e2e.observe(finished - arrival)
        if first_scheduled is not None:
            self.queue.observe(max(0.0, first_scheduled - arrival))
        if first_token is not None:
            self.ttft.observe(first_token - arrival)

    def observe_step(self, wall_duration: float, lag: float | None) -> None:
        """One engine step: its wall duration and how late (wall seconds) it started, if it was due."""
        self.steps += 1
        self.busy_wall_seconds += wall_duration
        if lag is not None:
            self.step_lag.observe(lag if lag > 0.0 else 0.0)

    def note_lora(self, running: Sequence[str], waiting: Sequence[str]) -> None:
        """vLLM's quirk: each running/waiting combination is its own series valued with the time last seen."""
        self._lora[(",".join(running), ",".join(waiting))] = self._wall()

    # -- exposition ------------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition (what `GET /metrics` answers)."""
        return generate_latest(self.registry)

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        labels = self._labels
        yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                     labels, stats.num_running)
        yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                     labels, stats.num_waiting)
        yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                     labels, stats.kv_cache_usage)
        created = self.created
        yield _counter("vllm:prefix_cache_queries",
                       "Prefix cache queries, in terms of number of queried tokens.",
                       [(labels, stats.prefix_cache_queries_tokens)], created)
        yield _counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                       [(labels, stats.prefix_cache_hits_tokens)], created)
        yield _counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                       [(labels, stats.num_preemptions)], created)
        yield _counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                       [(labels, stats.prompt_tokens)], created)
        yield _counter("vllm:generation_tokens", "Number of generation tokens processed.",
                       [(labels, stats.generation_tokens)], created)
        yield _counter("vllm:request_success", "Count of successfully processed requests.",
                       [({**labels, "finished_reason": r}, n) for r, n in self.success.items()], created)
        yield _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         labels, self.ttft)
        yield _histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                         labels, self.itl)
        yield _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                         labels, self.e2e)
        yield _histogram("vllm:request_queue_time_seconds",
                         "Histogram of time spent in WAITING phase for request.", labels, self.queue)
        yield _gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     self._cache_labels, 1.0)
        if self._max_loras > 0:
            self.note_lora(stats.running_adapters, stats.waiting_adapters)
            info = Metric("vllm:lora_requests_info", "Running stats on lora requests.", "gauge")
            max_lora = str(self._max_loras)
            for (running, waiting), seen in self._lora.items():
                info.add_sample("vllm:lora_requests_info", {
                    "max_lora": max_lora, "running_lora_adapters": running, "waiting_lora_adapters": waiting,
                }, seen)
            yield info
        yield from self._own(labels)

    def _own(self, labels: Mapping[str, str]) -> Iterable[Metric]:
        yield _gauge("kvgate_sim_time_scale",
                     "Simulator: wall seconds per simulated second. Every vllm:* latency is in simulated "
                     "seconds (the engine clock); multiply by this to get wall seconds.",
                     labels, self._time_scale)
        yield _gauge("kvgate_sim_slowdown", "Simulator fault: factor on every engine step's duration.",
                     labels, self._slowdown())
        yield _counter("kvgate_sim_steps", "Simulator: engine steps run.", [(labels, self.steps)],
                       self.created)
        yield _counter("kvgate_sim_busy_wall_seconds",
                       "Simulator: wall seconds the engine spent in steps (scaled durations).",
                       [(labels, self.busy_wall_seconds)], self.created)
        yield _counter("kvgate_sim_clock_jump_seconds",
                       "Simulator: simulated seconds the engine clock skipped because the simulator fell "
                       "behind by more than its catch-up allowance (its own CPU stretched simulated time).",
                       [(labels, self.clock_jump_seconds)], self.created)
        yield _histogram("kvgate_sim_step_lag_seconds",
                         "Simulator: wall seconds by which an engine step started after its deadline while "
                         "work was pending (the simulator's own CPU distorting its timings; not a vLLM "
                         "metric).",
                         labels, self.step_lag)


def _gauge(name: str, doc: str, labels: Mapping[str, str], value: float) -> Metric:
    metric = Metric(name, doc, "gauge")
    metric.add_sample(name, dict(labels), float(value))
    return metric


def _counter(name: str, doc: str, series: Iterable[tuple[Mapping[str, str], float]],
             created: float) -> Metric:
    metric = Metric(name, doc, "counter")
    for labels, value in series:
        metric.add_sample(name + "_total", dict(labels), float(value))
        metric.add_sample(name + "_created", dict(labels), created)
    return metric


def _histogram(name: str, doc: str, labels: Mapping[str, str], hist: BucketHistogram) -> Metric:
    metric = Metric(name, doc, "histogram")
    cumulative = 0
    for bound, count in zip((*hist.bounds, float("inf")), hist.counts, strict=True):
        cumulative += count
        metric.add_sample(name + "_bucket", {**labels, "le": _le(bound)}, float(cumulative))
    metric.add_sample(name + "_count", dict(labels), float(cumulative))
    metric.add_sample(name + "_sum", dict(labels), hist.sum)
    metric.add_sample(name + "_created", dict(labels), hist.created)
    return metric


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
