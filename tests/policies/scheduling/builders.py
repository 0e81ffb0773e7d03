"""Literal-input builders for scheduling tests: a replica and a context with only what a test sets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState, RequestInfo

NOW = 1000.0


def replica(name: str, **fields: Any) -> ReplicaState:
    """A healthy, freshly scraped replica of pool "m" named `name`, with `fields` overriding."""
    values: dict[str, Any] = {"url": f"http://{name}", "pool": "m", "scraped_at": NOW}
    values.update(fields)
    return ReplicaState(name=name, **values)


def request(adapter: str | None = None, base_model: str = "m", blocks: int = 0) -> RequestInfo:
    return RequestInfo(
        model=base_model if adapter is None else adapter,
        base_model=base_model,
        adapter=adapter,
        prompt_tokens=100,
        max_tokens=10,
        prefix_keys=tuple(range(blocks)),
    )


def context(
    *,
    adapter: str | None = None,
    base_model: str = "m",
    prefix_match: Mapping[str, int] | None = None,
    prefix_blocks: int = 0,
    session_replica: str | None = None,
    sequence: int = 0,
    now: float = NOW,
    stale_after_s: float = 1.0,
    max_in_flight_per_replica: int | None = None,
) -> SchedulingContext:
    return SchedulingContext(
        request=request(adapter, base_model, prefix_blocks),
        now=now,
        prefix_match=prefix_match or {},
        prefix_blocks=prefix_blocks,
        session_replica=session_replica,
        sequence=sequence,
        stale_after_s=stale_after_s,
        max_in_flight_per_replica=max_in_flight_per_replica,
    )


def names(replicas: Any) -> list[str]:
    return [r.name for r in replicas]
