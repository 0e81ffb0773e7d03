"""`kv-full`: drop replicas whose KV cache is (nearly) full. Soft."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class KvFullFilter:
    """Keeps replicas with `kv_usage < threshold` (a fraction in (0, 1], default 0.98).

    A replica at the threshold would queue the request or preempt a running one. Soft: when every
    replica is full, one of them still has to take the request (or the flow controller holds it).
    """

    name: str = "kv-full"
    threshold: float = 0.98
    soft: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        threshold = self.threshold
        return [r for r in candidates if r.kv_usage < threshold]
