"""The exact index in virtual time: each gateway's `ExactIndex`, fed by the simulated engines' KV events.

With `index="exact"` (`loadtests.des.gateways`) every simulated engine records vLLM's KV-cache events
(`EngineConfig.kv_events`). The run takes a replica's events when one of its steps starts, packs them
as the simulator's publisher does (`simulator.kv_events.wire.encode_payload`) and decodes them once
with the live gateway's decoder (`gateway.kv_events.wire.decode_payload`): the same `EventBatch` the
live subscriber hands over. Each gateway receives it `event_lag_s` after the step ends (its tokens
exist then) and applies it through a `ReplicaFeed` (the live sequence tracker, freshness judge and
event application) to its own `ExactIndex` (`policies.exact_index`, the live class). Every gateway
gets every batch, so all gateways hold the same picture, `event_lag_s` behind the engines.

`DesExactSource` is the live `KvEvents`' routing face (`gateway.routing.ExactSource`): the Router
matches the replicas in exact mode on it exactly as live (`Router._exact_match`), and the rest on its
approximate index. The engines start empty, so each replica's picture starts complete (as after an
`AllBlocksCleared`). Replay is never needed: the DES loses no batch.

Times are virtual seconds. Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gateway.kv_events.feed import ReplicaFeed
from gateway.kv_events.wire import EventBatch, decode_payload
from policies.exact_index import ExactIndex
from simulator.kv_events.events import KVEvent
from simulator.kv_events.wire import encode_payload


def event_batch(seq: int, now: float, events: Sequence[KVEvent]) -> EventBatch:
    """One step's events of a replica as the live gateway decodes them off the wire."""
    ts, decoded, rank = decode_payload(encode_payload(now, events))
    return EventBatch(topic="", seq=seq, ts=ts, events=decoded, dp_rank=rank)


class DesExactSource:
    """One gateway's exact index over `names` (engines serving `model`, `capacity` blocks each) and
    each replica's feed; what `Router.exact` asks for."""

    def __init__(self, names: Sequence[str], model: str, capacity: int, block_size: int,
                 stale_after_s: float, clock: Callable[[], float]) -> None:  # fmt: skip
        self.index = ExactIndex(default_capacity=max(1, capacity))
        self._clock = clock
        self._block_size = block_size
        self.feeds: dict[str, ReplicaFeed] = {}
        for name in names:
            self.index.add_replica(name, model, capacity)
            self.index.reset(name, complete=True)  # a fresh engine's cache is empty
            self.feeds[name] = ReplicaFeed(name, self.index, can_replay=False, stale_after_s=stale_after_s)

    def receive(self, replica: str, batch: EventBatch, now: float) -> None:
        """Replica `replica`'s batch reaches this gateway now."""
        self.feeds[replica].on_batch(batch, now)

    # -- gateway.routing.ExactSource ---------------------------------------------------------------

    def exact_block_sizes(self, names: Iterable[str], now: float) -> dict[str, int]:
        """Of `names`, the replicas in exact mode -> their engine's block size (as `KvEvents`)."""
        out: dict[str, int] = {}
        feeds = self.feeds
        for name in names:
            feed = feeds.get(name)
            if feed is not None and feed.exact(now):
                out[name] = self.index.block_size(name) or self._block_size
        return out

    def dispatched(self, replica: str) -> None:
        feed = self.feeds.get(replica)
        if feed is not None:
            feed.freshness.dispatched(self._clock())
