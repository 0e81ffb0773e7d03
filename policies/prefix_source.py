"""`PrefixSource`: what the router asks of its picture of the replicas' prefix caches.

Two kinds can stand behind it. The approximate `policies.prefix_index.PrefixIndex` learns only from
this gateway's own dispatches (`record`), so N gateway processes hold N different pictures. An exact
source fed by the replicas' KV-cache events would learn what every replica really stored and evicted,
whoever sent the request, and may ignore `record` (or keep it as a hint until the event arrives).
The router and the discrete-event mode take any object of this shape (`gateway.routing.Router`'s
`index` argument, one per simulated gateway in `loadtests.des`), so an exact source can be swapped in
per gateway without touching the routing path.

Keys are the chained block keys of `policies.prefix`; replica names are the fleet's. Pure and
single-threaded, like the index itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol


class PrefixSource(Protocol):
    """Which replica is believed to hold which leading prefix blocks."""

    def match(self, keys: Sequence[int], replicas: Iterable[str]) -> Mapping[str, int]:
        """Replica -> how many of `keys`' LEADING blocks it holds (replicas holding none may be absent)."""
        ...

    def record(self, replica: str, keys: Sequence[int]) -> None:
        """This gateway dispatched a prompt with `keys` to `replica`."""
        ...

    def set_capacity(self, replica: str, capacity_blocks: int) -> None:
        """The replica's cache size in index blocks (from its scraped KV size)."""
        ...

    def remove_replica(self, replica: str) -> None:
        """The replica left or restarted: it holds nothing any more."""
        ...

    def replica_sizes(self) -> dict[str, int]:
        """Replica -> keys believed held (a gauge)."""
        ...
