"""/metrics of a kvgate running several worker processes: every worker's metrics in one answer.

A Prometheus scrape reaches one worker at random (the port is shared, gateway/supervisor.py), so the
worker that is scraped asks its siblings for their samples (gateway/worker_group.py) and answers
with the merge:

- counters, histograms and summaries are summed sample by sample (same name and labels); a
  `_created` sample keeps the earliest;
- gauges are summed (requests and connections in flight, queue depths, buffered ledger records),
  except the ones in `GAUGE_MERGE`, which describe one worker's view of something shared (a
  replica's health, a discovery source's age, the config in force): those take the max or the min
  across workers, as listed there;
- each worker writes the samples it gave in its last answer to `metrics-w<index>.json` in the
  workers' directory. A worker that does not answer in time counts with that file. When a worker
  process exits, the supervisor renames its file `exited-<pid>.json`, and its counters, histograms
  and summaries keep counting in every later scrape (its gauges are dropped): so a worker's crash
  and restart never makes a counter go down, which Prometheus would read as a reset of the whole
  sum. These files are small (the families kvgate exports) and go with the directory when the
  supervisor exits.

Why not prometheus_client's multiprocess mode: about a dozen of kvgate's families are computed at
scrape time from live state (queue depths, fleet state, connection counts, reload counts, the
per-variant inter-chunk histograms kept as plain bucket counts), which that mode cannot see from
another process; and it would put a file-backed write behind a lock on every relayed chunk's
histogram observation. Here the hot path is unchanged; the cost is at scrape time (one exchange
per sibling over a Unix socket, a JSON encode and a merge: milliseconds).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

# A family as one worker gives it: [name, type, documentation, [[sample, {labels}, value], ...]].
Family = list[Any]

SUMMED_TYPES = frozenset({"counter", "histogram", "summary"})

# Gauges that are one worker's view of a shared thing: how their values across workers combine.
# Every other gauge is summed.
GAUGE_MERGE: dict[str, str] = {
    "kvgate_state_store_up": "min",  # 0 when any worker finds the store unreachable
    "kvgate_tenant_bucket_level": "min",  # the lowest level a worker last saw
    "kvgate_replica_healthy": "min",  # 0 when any worker has ejected the replica
    "kvgate_replica_state": "max",  # 1 for each state some worker sees the replica in
    "kvgate_replica_scrape_age_seconds": "max",  # the stalest worker's picture
    "kvgate_prefix_index_keys": "max",  # each worker keeps its own index; the largest
    # From main's KV-event work (each worker subscribes to every replica's events itself):
    "kvgate_prefix_index_mode": "min",  # 1 (exact) only when every worker's picture is exact
    "kvgate_exact_index_blocks": "max",  # each worker holds its own copy of the same picture
    "kvgate_discovery_age_seconds": "max",
    "kvgate_discovery_replicas": "max",
    "kvgate_config_generation": "max",
    "kvgate_config_info": "max",  # 1 for each config hash some worker has in force
    # Every worker computes a pool's goodput headroom from the same scrape of the same replicas, plus
    # its own in-flight requests (all of the load between scrapes is seen by no single worker): the
    # lowest is the worker that sees the most load, and a sum would count the pool's capacity once per
    # worker.
    "kvgate_pool_goodput_headroom_requests_per_second": "min",
    "kvgate_pool_goodput_headroom_tokens_per_second": "min",
    "kvgate_pool_goodput_headroom_ratio": "min",
}


def local_families(registry: CollectorRegistry) -> list[Family]:
    """This process's samples, JSON-ready (NaN and infinities kept: `json` writes them)."""
    return families_of(registry.collect())


def families_of(metrics: Iterable[Metric]) -> list[Family]:
    out: list[Family] = []
    for metric in metrics:
        samples = [[s.name, dict(s.labels), s.value] for s in metric.samples]
        out.append([metric.name, metric.type, metric.documentation, samples])
    return out


def dumps(families: Sequence[Family], pid: int) -> bytes:
    return json.dumps({"pid": pid, "families": families}, separators=(",", ":")).encode()


def loads(data: bytes) -> tuple[int, list[Family]]:
    doc = json.loads(data)
    return int(doc["pid"]), list(doc["families"])


def _mode(name: str, kind: str) -> str:
    if kind in SUMMED_TYPES:
        return "sum"
    return GAUGE_MERGE.get(name, "sum")


def merge(live: Iterable[Sequence[Family]], exited: Iterable[Sequence[Family]] = ()) -> list[Family]:
    """One family list from several workers' (module doc). `exited` workers give only their
    counters, histograms and summaries. Families and samples keep their first-seen order."""
    order: list[str] = []
    heads: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}

    def add(families: Sequence[Family], counters_only: bool) -> None:
        for name, kind, doc, samples in families:
            if counters_only and kind not in SUMMED_TYPES:
                continue
            if name not in heads:
                heads[name] = (kind, doc)
                order.append(name)
                values[name] = {}
            mode = _mode(name, kind)
            acc = values[name]
            for sample, labels, value in samples:
                key = (sample, tuple(sorted(labels.items())))
                old = acc.get(key)
                if old is None:
                    acc[key] = float(value)
                elif sample.endswith("_created"):
                    acc[key] = min(old, value)
                elif mode == "sum":
                    acc[key] = old + value
                elif mode == "max":
                    acc[key] = max(old, value)
                else:
                    acc[key] = min(old, value)

    for families in live:
        add(families, counters_only=False)
    for families in exited:
        add(families, counters_only=True)
    out: list[Family] = []
    for name in order:
        kind, doc = heads[name]
        out.append([name, kind, doc, [[s, dict(labels), v] for (s, labels), v in values[name].items()]])
    return out


class _Families(Collector):
    def __init__(self, families: Sequence[Family]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        for name, kind, doc, samples in self._families:
            metric = Metric(name, doc, kind)
            for sample, labels, value in samples:
                metric.add_sample(sample, labels, value)
            yield metric


def render(families: Sequence[Family]) -> bytes:
    """Prometheus text exposition of `families` (the same writer as a single process's /metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)
