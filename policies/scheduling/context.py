"""What one scheduling decision knows besides the candidates themselves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from policies.kv_fit import GroupFit
from policies.latency.estimator import LatencyEstimator
from policies.latency.replica_model import Quote
from policies.types import ReplicaState, RequestInfo


class SchedulingContext(NamedTuple):
    """The request and everything the gateway looked up for it, frozen for one decision.

    A NamedTuple rather than a frozen dataclass: it is built once per request, and a frozen
    dataclass's `__init__` (one `object.__setattr__` per field) cost 18.7k instructions against 7.0k.

    - `now`: the gateway's monotonic clock, seconds (compared with `ReplicaState.scraped_at`).
    - `prefix_match`: replica name -> leading prefix blocks it is believed to hold, in index blocks:
      `PrefixIndex.match`'s count, or for a replica on the exact index its engine blocks converted
      (possibly fractional); a replica missing from it holds none.
    - `prefix_blocks`: `len(request.prefix_keys)`, the denominator of the prefix-affinity share.
    - `session_replica`: the replica that served this session's previous request, if any.
    - `sequence`: a per-gateway request counter, so a stateless round-robin picker can rotate.
    - `stale_after_s`: a scrape older than this (seconds) makes a replica stale.
    - `max_in_flight_per_replica`: the requests flow control lets one replica hold (None: no cap).
    - `kv_fit`: the request's prefix group as the gateway's group ledger sees it (`policies.kv_fit`),
      for the `kv-fit` scorer; None when the active profile has no such scorer or the prompt no keys.
    - `latency`: the per-replica latency models (`policies.latency`), for scorers that predict TTFT
      and TPOT; None where the caller keeps none. Predictions are computed by the scorers that ask,
      so a profile without such a scorer pays nothing for it.
    - `knee_factor`: the latency gate's knee (`flow_control.knee_factor`) while predicted admission is
      on, for the `latency-knee` filter; None when it is off (the filter then keeps every candidate).
    - `quotes`: the decision's memo of `latency`'s prices, replica name -> `Quote` (`latency_quotes`):
      the first plugin that asks prices the candidates, later ones read the same quotes, so the
      `latency-knee` filter and the `predicted-latency` scorer price each candidate once. The one
      mutable part: whoever builds a context for a decision gives it a new empty dict, and never
      reuses the context for another decision (other states, or the ledger moved). None: each plugin
      prices for itself.
    """

    request: RequestInfo
    now: float
    prefix_match: Mapping[str, float]
    prefix_blocks: int
    session_replica: str | None = None
    sequence: int = 0
    stale_after_s: float = 1.0
    max_in_flight_per_replica: int | None = None
    kv_fit: GroupFit | None = None
    latency: LatencyEstimator | None = None
    knee_factor: float | None = None
    quotes: dict[str, Quote] | None = None


def latency_quotes(ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> list[Quote]:
    """`ctx.latency`'s quote of each candidate for `ctx.request` (it must be set): the decision's
    (`ctx.quotes`) where it has one, the others priced and added to it."""
    est = ctx.latency
    assert est is not None
    memo = ctx.quotes
    return est.price(
        candidates, ctx.request.prompt_tokens, ctx.prefix_match, ctx.now, ctx.stale_after_s,
        {} if memo is None else memo,
    )  # fmt: skip
