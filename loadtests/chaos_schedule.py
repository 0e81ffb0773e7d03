"""The chaos benchmark's fault timeline: what breaks when, as plain data (no I/O here).

A run of `duration_s` is cut into phases of `phase_s`. Each phase breaks one thing for the first
`on_fraction` of it, then puts it back and lets the fleet recover for the rest: so a phase's fault is
always followed by a calm stretch in which kvgate must readmit the replica, reconnect to Redis, and
drain what queued. The phases cycle through `KINDS` in order, each kind aimed at a replica chosen in
turn, so a 10-minute run at 40 s phases meets every fault twice.

Fault kinds (what `loadtests.chaos_soak` does for each):

- `error_rate`: the replica answers 30% of generation requests with 503 before the first byte
  (kvgate fails over to another replica);
- `crash`: the replica drops every stream's connection after 3 chunks (clients get an SSE error
  event and `[DONE]`);
- `hang`: the replica stalls every stream after 2 chunks (kvgate's chunk timeout ends them);
- `hang_first_byte`: the replica accepts generation requests and never answers (first-byte timeout,
  failover);
- `slowdown`: every engine step takes 4x as long;
- `health`: `/health` answers 503 (kvgate ejects the replica, then readmits it);
- `kill_replica`: the replica's process is killed (SIGKILL), restarted when the fault ends;
- `kill_redis`: the Redis that holds the limits is killed, restarted (empty) when the fault ends;
- `calm`: nothing (a baseline stretch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS: tuple[str, ...] = (
    "error_rate",
    "crash",
    "kill_replica",
    "hang",
    "kill_redis",
    "slowdown",
    "hang_first_byte",
    "health",
    "calm",
)

# The simulator's `POST /sim/faults` body that switches each replica-side fault on.
SIM_FAULTS: dict[str, dict[str, Any]] = {
    "error_rate": {"error_rate": 0.3, "error_status": 503},
    "crash": {"crash_after_chunks": 3},
    "hang": {"hang_after_chunks": 2},
    "hang_first_byte": {"hang_after_chunks": 0},
    "slowdown": {"slowdown": 4.0},
    "health": {"health_status": 503},
}
PROCESS_FAULTS = frozenset({"kill_replica", "kill_redis"})


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """`kind` is on from `start_s` to `end_s` (seconds since the run began) on `replica` (an index
    into the fleet; None for faults that are not a replica's: `kill_redis`, `calm`)."""

    kind: str
    replica: int | None
    start_s: float
    end_s: float


def build_schedule(
    duration_s: float,
    replicas: int,
    phase_s: float = 40.0,
    on_fraction: float = 0.5,
    warmup_s: float = 20.0,
    kinds: tuple[str, ...] = KINDS,
) -> list[FaultWindow]:
    """The faults of a run, in time order. Nothing breaks during the first `warmup_s` nor in the last
    phase's calm stretch; a phase that would not end before `duration_s` is left out."""
    if replicas < 2:
        raise ValueError("the chaos schedule needs at least 2 replicas (one must stay up)")
    if not 0 < on_fraction < 1:
        raise ValueError("on_fraction must be in (0, 1)")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    out: list[FaultWindow] = []
    t = warmup_s
    k = 0
    victim = 0
    while t + phase_s <= duration_s:
        kind = kinds[k % len(kinds)]
        replica = None
        if kind != "kill_redis" and kind != "calm":
            replica = victim % replicas
            victim += 1
        out.append(FaultWindow(kind, replica, t, t + phase_s * on_fraction))
        t += phase_s
        k += 1
    return out
