"""What the simulated client sees of each request, turned into the live runner's `RequestTrace`s.

An `OpenRequest` follows one request from the client's send to its end: the token times are the
engine's step ends (no network in between: the simulated client reads a token the instant the step
that made it ends). At the end it becomes a `loadtests.measures.RequestTrace` with the live runner's
fields and meanings, times in virtual seconds from the run's start.

Chunk times. A live trace keeps every content chunk's time (one per token here), which costs about
32 bytes per token in Python lists: fine for thousands of requests, gigabytes for 10^6 requests of a
few hundred tokens. With `record_chunks` off, traces keep `chunk_times` empty (TTFT, TPOT and E2E stay
exact; they use `first_token`, `end` and `output_tokens`), and the run collects every inter-token gap
in an `ItlHistogram` instead: exact counts, values rounded to 1 µs of virtual time, memory bounded
by the number of distinct gaps. A per-request ITL SLO (`itl=`) cannot be checked in that mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from loadtests.des.gateway_model import GatewayModel, Routed
from loadtests.measures import LatencyStats, RequestTrace
from loadtests.workloads.spec import RequestSpec
from policies.types import RequestInfo

if TYPE_CHECKING:
    from loadtests.des.admissions import Waiting

_US = 1_000_000


class OpenRequest:
    """One request between send and end; owned by the run. Times are virtual seconds.

    `engine_id` is unique within the run (spec ids need not be). `replica` is the index of the
    replica it was routed to (-1 before routing); `chunks` is None when chunk times are not kept.
    With flow control modelled: `admitted` is the gateway that let it through and the request as
    it saw it (None before, or when not modelled), `wait` its place in that gateway's queue while
    it waits there.
    """

    __slots__ = (
        "admitted",
        "chunks",
        "engine_id",
        "first",
        "last",
        "prompt_tokens",
        "replica",
        "routed",
        "spec",
        "start",
        "wait",
    )

    def __init__(self, spec: RequestSpec, start: float, engine_id: str, record_chunks: bool) -> None:
        self.spec = spec
        self.start = start
        self.engine_id = engine_id
        self.routed: Routed | None = None
        self.replica = -1
        self.admitted: tuple[GatewayModel, RequestInfo] | None = None
        self.wait: Waiting | None = None
        self.prompt_tokens: int | None = None
        self.first: float | None = None
        self.last = start
        self.chunks: list[float] | None = [] if record_chunks else None

    def trace(
        self,
        end: float,
        *,
        output_tokens: int,
        cached_tokens: int | None,
        status: int = 200,
        error: str | None = None,
        replica_name: str | None = None,
    ) -> RequestTrace:
        spec = self.spec
        return RequestTrace(
            request_id=spec.request_id,
            tenant=spec.tenant,
            group=spec.group,
            start=self.start,
            first_token=self.first,
            end=end,
            chunk_times=self.chunks if self.chunks is not None else [],
            output_tokens=output_tokens,
            prompt_tokens=self.prompt_tokens if status == 200 else None,
            cached_tokens=cached_tokens,
            status=status,
            error=error,
            replica=replica_name,
        )


class ItlHistogram:
    """Inter-token gaps in virtual seconds, counted per 1 µs bucket (see the module docstring).

    `counts` maps a gap in whole microseconds to how many gaps rounded to it; `add` is on the
    per-token path, so callers may also update `counts` directly with `round(gap * 1e6)` keys.
    """

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def add(self, gap_s: float, n: int = 1) -> None:
        key = round(gap_s * _US)
        self.counts[key] = self.counts.get(key, 0) + n

    def __len__(self) -> int:
        return sum(self.counts.values())

    def stats(self) -> LatencyStats:
        """The gaps' summary with `loadtests.measures`' percentile definition (linear between
        closest ranks), in seconds."""
        items = sorted(self.counts.items())
        n = sum(c for _, c in items)
        if not n:
            return LatencyStats(0, None, None, None, None, None)
        mean = sum(k * c for k, c in items) / n / _US
        p50, p90, p95, p99 = (_weighted_percentile(items, n, q) / _US for q in (50, 90, 95, 99))
        return LatencyStats(n, mean, p50, p90, p95, p99)


def _weighted_percentile(items: Iterable[tuple[int, int]], n: int, q: float) -> float:
    rank = (n - 1) * q / 100
    lo = int(rank)
    frac = rank - lo
    low_value: float | None = None
    seen = 0
    for value, count in items:
        seen += count
        if low_value is None and seen > lo:
            low_value = value
            if frac == 0 or seen > lo + 1:
                return low_value + (value - low_value) * frac
        elif low_value is not None:
            return low_value + (value - low_value) * frac
    assert low_value is not None
    return low_value
