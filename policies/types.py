"""Plain, frozen inputs shared by every decision in `policies/`.

The gateway gathers these from the network (scrapes, request bodies, config) and hands them to pure
functions; nothing here does I/O. Times are seconds on the caller's monotonic clock unless a field says
otherwise. Token counts are tokens, byte counts are bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_EMPTY: Mapping[str, str] = MappingProxyType({})


class Band(enum.IntEnum):
    """Priority band. Lower value = more important; `Band.CRITICAL < Band.STANDARD`."""

    CRITICAL = 0
    STANDARD = 1
    SHEDDABLE = 2

    @classmethod
    def parse(cls, text: str) -> Band:
        """`"critical"` -> `Band.CRITICAL`; raises ValueError for unknown names."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(b.name.lower() for b in cls)
            raise ValueError(f"unknown priority {text!r}; expected one of: {names}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


class ReplicaPhase(enum.Enum):
    """Where a replica stands in the fleet's membership; `value` is a metric and API label.

    - READY: in service, may be chosen for new requests.
    - NOT_READY: known but not selectable (its source says not ready, or its `/v1/models` has not yet
      shown the expected model). Its metrics and the prefix index's picture of its cache are kept,
      so a readiness blip costs no cache state.
    - TERMINATING: takes no new requests; requests already sent to it finish (draining, a
      terminating endpoint, or a replica that left discovery while it still had requests in flight).

    A replica that is gone is not in the snapshot at all.
    """

    READY = "ready"
    NOT_READY = "not_ready"
    TERMINATING = "terminating"


# A module constant: on Python 3.11 `ReplicaPhase.READY` goes through the enum metaclass's attribute
# hook, ~1,000 instructions per read, and `in_service` is read for every candidate of every decision.
_READY = ReplicaPhase.READY


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What the gateway believes about one replica at one instant.

    `running`, `waiting`, `kv_usage` and the adapter sets come from the replica's last good scrape;
    `in_flight*` are the gateway's own live counts (sent, not yet finished), exact between scrapes;
    `in_flight_at_scrape` is its in-flight count when the last scrape was recorded, so `running` and
    `waiting` beyond it are other senders' requests (None: not known, take `in_flight`). Compared
    with the live count instead, a request of kvgate's that ended after the scrape would still look
    like another sender's until the next one.
    `scraped_at` is None until the first good scrape. `kv_usage` is a fraction in [0, 1].
    `phase` is its membership (`ReplicaPhase`); only READY replicas take new requests. `ready_since`
    is when it last became READY while it ramps up (slow start over `slow_start_s` seconds, see
    `policies.slow_start`); None when it does not ramp.
    """

    name: str
    url: str
    pool: str
    healthy: bool = True
    scraped_at: float | None = None
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0
    in_flight_tokens: int = 0
    in_flight_at_scrape: int | None = None
    block_size: int = 16
    num_gpu_blocks: int = 0
    max_loras: int = 0
    adapters: frozenset[str] = frozenset()
    active_adapters: frozenset[str] = frozenset()
    # A factory, not `default=`: Python 3.11 refuses an unhashable default (mappingproxy) outright.
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    phase: ReplicaPhase = ReplicaPhase.READY
    ready_since: float | None = None
    slow_start_s: float = 0.0

    @property
    def in_service(self) -> bool:
        """May take new requests (READY); says nothing about health, see `healthy`."""
        return self.phase is _READY

    @property
    def kv_capacity_tokens(self) -> int:
        """KV cache size in tokens as the replica reports it (0 when unknown)."""
        return self.block_size * self.num_gpu_blocks

    def is_fresh(self, now: float, stale_after_s: float) -> bool:
        return self.scraped_at is not None and now - self.scraped_at <= stale_after_s


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Every known replica at `taken_at` (monotonic seconds), whatever its phase. Order is stable
    while membership is: static replicas in config order, then discovered ones as they joined."""

    replicas: tuple[ReplicaState, ...]
    taken_at: float

    def by_name(self, name: str) -> ReplicaState | None:
        for r in self.replicas:
            if r.name == name:
                return r
        return None

    def pool(self, pool: str) -> tuple[ReplicaState, ...]:
        return tuple(r for r in self.replicas if r.pool == pool)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One parsed client request, as the policies see it.

    `model` is what the client asked for; `base_model` is the pool it runs in and `adapter` the LoRA
    adapter name or None. `prompt_tokens` is an estimate unless `prompt_tokens_exact` is set.
    `max_tokens` is the output cap the reservation uses for the whole request: the per-completion cap
    (already defaulted by tenant policy) x `n` x the prompts of a completions batch.
    `prefix_keys` are the chained block keys of the canonical prompt (see `policies.prefix`).
    `token_bytes` is the prompt's token ids packed 4 bytes each (`policies.exact_keys.pack_tokens`)
    when a tokenizer counted them, b"" otherwise; with `cache_salt` (the request's own, if any) it is
    what the exact index matches, at each engine's block size.
    `route` is the route the client named (None: it named a model) and `target` the canonical name
    of what serves it (`base` or `base:adapter`; "" until resolved), for whoever records the request.
    """

    model: str
    base_model: str
    adapter: str | None
    prompt_tokens: int
    max_tokens: int
    stream: bool = False
    tenant: str = "anonymous"
    band: Band = Band.STANDARD
    session_id: str | None = None
    prefix_keys: tuple[int, ...] = ()
    prompt_tokens_exact: bool = False
    route: str | None = None
    target: str = ""
    token_bytes: bytes = b""
    cache_salt: str | None = None

    @property
    def reserved_tokens(self) -> int:
        """Tokens reserved against a token bucket at admission: input plus the output cap."""
        return self.prompt_tokens + self.max_tokens
