"""Where one replica's KV events come from: its own `replicas[]` entry, else its pool's `models[]`.

A replica's own `kv_events` / `kv_events_replay` (static list, replicas file) win. Otherwise its
pool's `models[].kv_events: {port, replay_port, topic}` applies, at the host of the replica's URL:
that is how replicas found by DNS or Kubernetes get theirs. The topic is the pool's in both cases
("" = every topic, vLLM's default). No endpoint: the replica stays on the approximate index.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import Config
from gateway.fleet.membership import ReplicaSpec
from gateway.kv_events.address import tcp_endpoint
from gateway.upstream.address import parse_replica_url


@dataclass(frozen=True, slots=True)
class KvEndpoints:
    events: str  # tcp://host:port of the PUB socket
    replay: str | None  # tcp://host:port of the ROUTER replay socket
    topic: str = ""


def resolve(spec: ReplicaSpec, pool: str, config: Config) -> KvEndpoints | None:
    """The replica's KV-event endpoints under `config`; None when it has none (or no pool yet)."""
    own = spec.config
    settings = config.model_settings(pool).kv_events if pool else None
    topic = settings.topic if settings is not None else ""
    if own is not None and own.kv_events is not None:
        return KvEndpoints(own.kv_events, own.kv_events_replay, topic)
    if settings is None:
        return None
    host = parse_replica_url(spec.url).host
    replay = None if settings.replay_port is None else tcp_endpoint(host, settings.replay_port)
    return KvEndpoints(tcp_endpoint(host, settings.port), replay, topic)
