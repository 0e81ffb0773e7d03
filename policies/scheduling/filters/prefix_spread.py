"""`prefix-spread`: a hot prefix group takes a second replica before it crowds the first. Soft.

Prefix affinity (and `predicted-latency`'s cost, which sees a held prefix as prefill saved) keeps a
group's requests where its prefix is held: right for one request, whose own TTFT is lowest there,
but a group with many requests in flight then runs them all in one replica's batch while replicas
next to it idle. A second copy of a shared prefix costs one cold prefill and then serves every later
request of the group: on two hot 4,096-token prefixes over 4 replicas, `predicted-latency` left two
replicas idle at 8 streams per replica and served 10-19% less than `default`, and `default` left
two idle at 4 per replica (docs/benchmarks.md, "Hot prefixes").

    group_r = the requests in flight on replica r of the request's prefix group (kvgate's KV ledger:
              same first block, and the prompt shares at least `min_share` of its prefix keys
              with the group's leading keys)
    least   = the least load (waiting + in flight) among the candidates

It drops the candidates where group_r > least + `slack`: there the group alone already has more
requests than the least-loaded replica has of everything, so the next one goes elsewhere and warms
a copy. `min_share` keeps conversations out of it: turns of different conversations share a system
prompt, but most of a turn's prompt is its own history. A no-op without the latency model (its KV
ledger is the count) or without prefix keys; keeps at least the least-loaded candidate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class PrefixSpreadFilter:
    """See the module docstring. `slack` >= 0 (requests), `min_share` in (0, 1]."""

    name: str = "prefix-spread"
    slack: float = 4.0
    min_share: float = 0.9
    soft: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.slack < 0:
            raise ValueError(f"slack must be >= 0, got {self.slack}")
        if not 0.0 < self.min_share <= 1.0:
            raise ValueError(f"min_share must be in (0, 1], got {self.min_share}")

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        est, keys = ctx.latency, ctx.request.prefix_keys
        if est is None or not keys or len(candidates) < 2:
            return candidates
        loads = [r.waiting + r.in_flight for r in candidates]
        limit = min(loads) + self.slack
        if max(loads) <= limit:
            return candidates  # the common case: no replica can be crowded by one group
        # A group's requests there are among the replica's own in flight: only a replica loaded
        # beyond `limit` is looked up.
        # Shared keys, not tokens: the keys are the prompt's own blocks whatever counted its tokens
        # (a tokenizer's count against keys over its bytes would make a share of tokens unreachable).
        shared = math.ceil(self.min_share * len(keys))
        kept = [
            r
            for r, load in zip(candidates, loads)  # noqa: B905 - same length
            if load <= limit or est.group_in_flight(r.name, keys, shared) <= limit
        ]
        return kept if len(kept) < len(candidates) else candidates
