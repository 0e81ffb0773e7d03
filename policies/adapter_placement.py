"""Where to load an adapter that no healthy replica holds, and which adapters to unload to make room.

Placement order (the loader tries replicas in this order until one loads it): healthy replicas of
the pool only; those known to run LoRA (`max_loras` > 0, from `vllm:lora_requests_info`) before
those not known to; then the most free adapter slots in the running batch (`max_loras` minus the
adapters active now), the fewest adapters loaded, the least load (engine queue plus what this
gateway has in flight there), and the name, so every gateway orders a fleet alike.

Eviction: past `max_adapters_per_replica` adapters loaded (counting the one about to be), the least
recently used ones go first — but only adapters kvgate can load again (`managed`: those with a
source in config), never one the replica is running or queueing now (`active`) or one with
requests of this gateway in flight (`busy`), never the one being loaded. When too few may go, fewer
are unloaded: the limit is a target, not a refusal.

Pure: the caller passes the fleet picture and the last-use times.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from policies.types import ReplicaState


def placement_order(candidates: Sequence[ReplicaState]) -> list[ReplicaState]:
    """The healthy `candidates` in the order to try loading an adapter on them (see module doc)."""

    def key(r: ReplicaState) -> tuple[int, int, int, int, str]:
        free = r.max_loras - len(r.active_adapters) if r.max_loras > 0 else 0
        return (0 if r.max_loras > 0 else 1, -free, len(r.adapters), r.waiting + r.in_flight, r.name)

    return sorted((r for r in candidates if r.healthy), key=key)


def adapters_to_evict(
    loaded: Collection[str],
    adding: str,
    limit: int | None,
    *,
    managed: Collection[str],
    active: Collection[str] = (),
    busy: Collection[str] = (),
    last_used: Mapping[str, float] | None = None,
) -> list[str]:
    """Adapters to unload from a replica holding `loaded` before it loads `adding`, least recently
    used first (never used: oldest; ties by name). `limit` None: no limit, nothing to unload."""
    if limit is None:
        return []
    after = len(set(loaded) | {adding})
    excess = after - limit
    if excess <= 0:
        return []
    used = last_used or {}
    candidates = [a for a in loaded if a != adding and a in managed and a not in active and a not in busy]
    candidates.sort(key=lambda a: (used.get(a, float("-inf")), a))
    return candidates[:excess]
