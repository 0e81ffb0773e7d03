"""The admission queue used while the fleet is saturated.

Order: strict priority between bands (`Band.CRITICAL` before `Band.STANDARD` before
`Band.SHEDDABLE`); inside a band, weighted fair shares between tenants by estimated TOKENS
(start-time fair queuing); FIFO inside a tenant.

Start-time fair queuing, per band: the band keeps a virtual time `V`, and each tenant with waiting
items (a "flow") a finish tag `F` (where its last served item ended, in virtual time). The head item
of a flow starts at

    S = max(F, V_at_push(head))

`pop` serves the flow whose head has the smallest `S` (ties: the head pushed first), sets `V = S`,
and `F = S + max(cost_tokens, 1) / weight`. So a tenant is charged its items' tokens divided by its
weight; over a long backlog each tenant's served tokens are proportional to its weight, and one tenant's huge
items cannot starve another's small ones (those wait behind at most one item of the big tenant).
A tenant that was idle comes back at the `V` of the moment it pushes: it banks no credit while away;
a tenant that just had a huge item served still pays for it (`F` is remembered).

`remove` (the client went away) and `expire` (deadline passed) charge nothing: the order of every
other item is exactly what it would have been had the removed item never been pushed, because tags
depend only on served items and on each item's own push time.

Complexity: `push`, `pop`, `peek` are O(log n) amortized (one heap per band over flows, one heap
over deadlines, both with lazy deletion and compaction once stale entries outnumber live ones);
`remove` is O(log n) when it removes a flow's head, O(1) otherwise; `expire` is O(k log n) for k
overdue items, plus O(flows) to forget tenants that carry no fairness state any more; `pop(eligible)`
is O(flows in the bands it scans).

State: a mutable in-memory structure, no I/O and no clock (`now` is passed to `expire`). It is not
thread-safe: one event loop owns it.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from policies.types import Band

P = TypeVar("P")

_COMPACT_MIN_STALE = 64


@dataclass(frozen=True, slots=True)
class QueueItem(Generic[P]):
    """One waiting request. `cost_tokens` (>= 0) is the fairness charge, in tokens (the request's
    reservation: estimated prompt tokens + output cap); 0 is charged as 1. `weight` (> 0) is the
    tenant's share; give every item of a tenant the same weight. `enqueued_at` and `deadline` are
    seconds on the caller's clock; `deadline = math.inf` for none. `payload` is opaque (e.g. the
    waiter's future)."""

    item_id: str
    tenant: str
    band: Band
    weight: float
    cost_tokens: int
    enqueued_at: float
    deadline: float
    payload: P

    def __post_init__(self) -> None:
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"weight must be a positive finite number, got {self.weight!r}")
        if self.cost_tokens < 0:
            raise ValueError(f"cost_tokens must be >= 0, got {self.cost_tokens!r}")


@dataclass(frozen=True, slots=True)
class QueuedWork:
    """Requests and tokens (sum of `cost_tokens`) waiting."""

    requests: int
    tokens: int


@dataclass(frozen=True, slots=True)
class _Entry(Generic[P]):
    item: QueueItem[P]
    seq: int  # push order, unique for the queue's life
    vpush: float  # the band's virtual time at push


@dataclass(slots=True)
class _Flow(Generic[P]):
    """One tenant's waiting items in one band, FIFO. `live` is the `seq` of the head whose heap entry
    is current (-1 while the flow is empty)."""

    finish: float
    entries: OrderedDict[str, _Entry[P]] = field(default_factory=OrderedDict)
    live: int = -1


@dataclass(slots=True)
class _Band(Generic[P]):
    vtime: float = 0.0
    flows: dict[str, _Flow[P]] = field(default_factory=dict)
    heap: list[tuple[float, int, str]] = field(default_factory=list)  # (start, head seq, tenant)
    stale: int = 0
    requests: int = 0
    tokens: int = 0


class FairQueue(Generic[P]):
    """Priority bands, weighted fair shares of tokens between tenants, FIFO per tenant.

    `push` refuses a duplicate `item_id` (ValueError); limits on length (global or per tenant) are the
    caller's decision, made with `len()` and `depth_of()` before `push`.
    """

    def __init__(self) -> None:
        self._bands: tuple[_Band[P], ...] = tuple(_Band() for _ in Band)
        self._entries: dict[str, _Entry[P]] = {}
        self._deadlines: list[tuple[float, int, str]] = []  # (deadline, seq, item_id)
        self._deadlines_stale = 0
        self._tenant_depth: dict[str, int] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._entries

    def get(self, item_id: str) -> QueueItem[P] | None:
        entry = self._entries.get(item_id)
        return None if entry is None else entry.item

    def depth_by_band(self) -> dict[Band, int]:
        return {band: self._bands[band].requests for band in Band}

    def depth_of(self, tenant: str) -> int:
        """Items of `tenant` waiting, all bands together."""
        return self._tenant_depth.get(tenant, 0)

    def work_ahead(self, band: Band) -> QueuedWork:
        """Work a request newly arriving in `band` could wait behind: everything queued in `band` and
        in the bands above it. An upper bound (fair sharing may put the newcomer ahead of part of its
        own band), for a Retry-After estimate. O(bands)."""
        requests = tokens = 0
        for b in self._bands[: band + 1]:
            requests += b.requests
            tokens += b.tokens
        return QueuedWork(requests, tokens)

    def push(self, item: QueueItem[P]) -> None:
        if item.item_id in self._entries:
            raise ValueError(f"item {item.item_id!r} is already queued")
        self._seq += 1
        band = self._bands[item.band]
        entry = _Entry(item, self._seq, band.vtime)
        flow = band.flows.get(item.tenant)
        if flow is None:
            flow = band.flows[item.tenant] = _Flow(finish=band.vtime)
        flow.entries[item.item_id] = entry
        if flow.live < 0:
            self._schedule(band, flow, entry)
        self._entries[item.item_id] = entry
        if item.deadline != math.inf:
            heapq.heappush(self._deadlines, (item.deadline, entry.seq, item.item_id))
        band.requests += 1
        band.tokens += item.cost_tokens
        self._tenant_depth[item.tenant] = self._tenant_depth.get(item.tenant, 0) + 1

    def peek(self) -> QueueItem[P] | None:
        """The item `pop` would return, left in place."""
        for band in self._bands:
            flow = self._head_flow(band)
            if flow is not None:
                return next(iter(flow.entries.values())).item
        return None

    def pop(self, eligible: Callable[[str], bool] | None = None) -> QueueItem[P] | None:
        """Remove and return the next item to dispatch, or None when empty; charges its tenant.

        With `eligible`, only tenants for which it is true are considered: the next item in the same
        order among theirs (the others keep their places and tags), or None. That costs O(flows in
        the bands scanned) instead of O(log n)."""
        for band in self._bands:
            if eligible is None:
                flow = self._head_flow(band)
                if flow is None:
                    continue
                start = heapq.heappop(band.heap)[0]
            else:
                found = self._first_eligible(band, eligible)
                if found is None:
                    continue
                start, flow = found
                band.stale += 1  # its heap entry stays behind
            item = self._serve(band, flow, start)
            if eligible is not None:
                self._maybe_compact_band(band)
            return item
        return None

    def _first_eligible(
        self, band: _Band[P], eligible: Callable[[str], bool]
    ) -> tuple[float, _Flow[P]] | None:
        best: tuple[float, int] | None = None
        chosen: _Flow[P] | None = None
        for tenant, flow in band.flows.items():
            if not flow.entries or not eligible(tenant):
                continue
            head = next(iter(flow.entries.values()))
            key = (max(flow.finish, head.vpush), head.seq)  # as `_schedule` put it on the heap
            if best is None or key < best:
                best, chosen = key, flow
        return None if best is None or chosen is None else (best[0], chosen)

    def _serve(self, band: _Band[P], flow: _Flow[P], start: float) -> QueueItem[P]:
        """Take `flow`'s head, which starts at virtual time `start`, and charge its tenant."""
        _, entry = flow.entries.popitem(last=False)
        item = entry.item
        band.vtime = max(band.vtime, start)
        # At least one token each: a flood of free items must not hold a band forever.
        flow.finish = start + max(item.cost_tokens, 1) / item.weight
        flow.live = -1
        if flow.entries:
            self._schedule(band, flow, next(iter(flow.entries.values())))
        self._uncount(item, band)
        self._orphan_deadline(item)
        return item

    def remove(self, item_id: str) -> QueueItem[P] | None:
        """Take a waiting item out without charging its tenant (its client went away). Returns the
        item, or None if it is not queued (already popped, expired or removed)."""
        item = self._take_out(item_id)
        if item is not None:
            self._orphan_deadline(item)
        return item

    def expire(self, now: float) -> list[QueueItem[P]]:
        """Remove and return every item whose deadline has come (`deadline <= now`), earliest deadline
        first (ties: push order), without charging their tenants. Also forgets idle tenants whose
        finish tag has fallen behind the band's virtual time (they would restart at `V` anyway)."""
        out: list[QueueItem[P]] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, seq, item_id = heapq.heappop(heap)
            entry = self._entries.get(item_id)
            if entry is None or entry.seq != seq:
                self._deadlines_stale -= 1
                continue
            item = self._take_out(item_id)
            assert item is not None
            out.append(item)
        for band in self._bands:
            idle = [t for t, f in band.flows.items() if not f.entries and f.finish <= band.vtime]
            for tenant in idle:
                del band.flows[tenant]
        return out

    def _schedule(self, band: _Band[P], flow: _Flow[P], head: _Entry[P]) -> None:
        flow.live = head.seq
        start = max(flow.finish, head.vpush)
        heapq.heappush(band.heap, (start, head.seq, head.item.tenant))

    def _head_flow(self, band: _Band[P]) -> _Flow[P] | None:
        """The flow whose head is served next in `band`, dropping stale heap entries on the way."""
        heap = band.heap
        while heap:
            _, seq, tenant = heap[0]
            flow = band.flows.get(tenant)
            if flow is not None and flow.live == seq:
                return flow
            heapq.heappop(heap)
            band.stale -= 1
        return None

    def _take_out(self, item_id: str) -> QueueItem[P] | None:
        """Unlink a waiting item from its flow and the counters; its deadline entry is left alone."""
        entry = self._entries.get(item_id)
        if entry is None:
            return None
        item = entry.item
        band = self._bands[item.band]
        flow = band.flows[item.tenant]
        del flow.entries[item_id]
        if flow.live == entry.seq:  # it was the head: the next one (if any) takes its own tag
            flow.live = -1
            band.stale += 1
            if flow.entries:
                self._schedule(band, flow, next(iter(flow.entries.values())))
            self._maybe_compact_band(band)
        self._uncount(item, band)
        return item

    def _uncount(self, item: QueueItem[P], band: _Band[P]) -> None:
        del self._entries[item.item_id]
        band.requests -= 1
        band.tokens -= item.cost_tokens
        left = self._tenant_depth[item.tenant] - 1
        if left:
            self._tenant_depth[item.tenant] = left
        else:
            del self._tenant_depth[item.tenant]

    def _orphan_deadline(self, item: QueueItem[P]) -> None:
        """`item` left the queue other than through `expire`: its deadline entry is now stale."""
        if item.deadline != math.inf:
            self._deadlines_stale += 1
            self._maybe_compact_deadlines()

    def _maybe_compact_band(self, band: _Band[P]) -> None:
        if band.stale > _COMPACT_MIN_STALE and band.stale > len(band.heap) - band.stale:
            flows = band.flows
            band.heap = [e for e in band.heap if (f := flows.get(e[2])) is not None and f.live == e[1]]
            heapq.heapify(band.heap)
            band.stale = 0

    def _maybe_compact_deadlines(self) -> None:
        stale = self._deadlines_stale
        if stale > _COMPACT_MIN_STALE and stale > len(self._deadlines) - stale:
            entries = self._entries
            self._deadlines = [
                e for e in self._deadlines if (x := entries.get(e[2])) is not None and x.seq == e[1]
            ]
            heapq.heapify(self._deadlines)
            self._deadlines_stale = 0
