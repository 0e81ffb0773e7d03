"""`least-inflight-tokens`: fewer tokens in flight from this gateway is better, min-max normalized."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.scheduling.scorers.min_max import inverted_min_max
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class LeastInflightTokensScorer:
    """(max - tokens) / (max - min) of `in_flight_tokens` over the candidates; 1.0 for all when equal.

    A token-weighted load signal: ten short chats and ten 30k-token prompts are the same queue depth but
    very different work. Exact between scrapes, since the gateway counts what it sent.
    """

    name: str = "least-inflight-tokens"

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        return inverted_min_max([r.in_flight_tokens for r in candidates])
