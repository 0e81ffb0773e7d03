"""`serves-adapter`: drop replicas that cannot serve the request's LoRA adapter. Hard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class ServesAdapterFilter:
    """Keeps replicas that list the request's adapter; keeps all when the request has none.

    `allow_loadable`: also keep replicas with LoRA enabled (`max_loras > 0`) that do not list the
    adapter, for fleets whose replicas load adapters on demand (vLLM's LoRA resolver). Off by default:
    a replica without the adapter answers 404.
    """

    name: str = "serves-adapter"
    allow_loadable: bool = False
    soft: ClassVar[bool] = False

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        adapter = ctx.request.adapter
        if adapter is None:
            return candidates
        if self.allow_loadable:
            return [r for r in candidates if adapter in r.adapters or r.max_loras > 0]
        return [r for r in candidates if adapter in r.adapters]
