"""The usage ledger: what each tenant used, per key, model and UTC hour, for chargeback.

Per settled request, `record` adds its charge (`policies.charging`: requests, prompt, cached and
output tokens, and whether the tokens are kvgate's estimate) to an in-process aggregate: a few dict
operations, no I/O, no await, so the request path pays microseconds. A background task writes the
aggregate to the ledger store (`gateway/stores/ledger_store.py`) every `ledger.flush_interval_s`, or
as soon as `ledger.flush_max_records` requests have been recorded, in ONE store call (Redis: one
pipeline). On a clean shutdown (SIGTERM, SIGINT) it flushes once more.

What a gateway that dies between flushes loses, and the bound: a crash (SIGKILL, out of memory, the
machine) loses the usage it recorded since its last successful flush — at most `flush_interval_s` of
its settled requests, and never more than `flush_max_records` of them while the store answers. While
the store is unreachable nothing is dropped: batches wait (merged, so memory grows with distinct
tenant x key x model x hour, not with requests) and are retried with the same batch id, so a batch
the store applied before its answer was lost is not counted twice. `kvgate_ledger_records_pending`
says how many requests are not yet written; `kvgate_ledger_flush_errors_total` counts failed flushes.
The token buckets and quotas do not depend on the ledger: they are settled in the store at once.

One event loop; `record` is safe to call from any coroutine on it; flushes run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.config_tenancy import LedgerConfig
from gateway.metrics import GatewayMetrics
from gateway.stores.ledger_store import HOUR_S, METRICS, Cell, LedgerStore, Row, Slot
from policies.charging import Charge

log = logging.getLogger(__name__)

_STOP_FLUSH_TIMEOUT_S = 5.0


@dataclass(slots=True)
class _Batch:
    id: str
    rows: dict[Slot, dict[Cell, list[int]]] = field(default_factory=dict)
    records: int = 0


class UsageLedger:
    """Buffered writer and reader of one ledger store. `gateway_id` makes batch ids unique."""

    def __init__(
        self,
        store: LedgerStore,
        config: LedgerConfig,
        metrics: GatewayMetrics,
        gateway_id: str,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._cfg = config
        self._m = metrics
        self._id = gateway_id
        self._wall = wall_clock
        self._seq = 0
        self._pending = self._new_batch()
        self._in_doubt: _Batch | None = None  # failed once: may have been applied, retried as is
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        metrics.add_callback(self._collect)

    def _new_batch(self) -> _Batch:
        self._seq += 1
        return _Batch(f"{self._id}:{self._seq}")

    def record(self, tenant: str, key: str, model: str, c: Charge) -> None:
        """Add one settled request's charge (no I/O)."""
        if not c.requests and not c.tokens:
            return
        b = self._pending
        hour = int(self._wall()) // HOUR_S * HOUR_S
        cells = b.rows.get((tenant, hour))
        if cells is None:
            cells = b.rows[(tenant, hour)] = {}
        v = cells.get((key, model))
        if v is None:
            cells[(key, model)] = [
                c.requests,
                c.prompt_tokens,
                c.cached_tokens,
                c.output_tokens,
                int(c.estimated),
            ]
        else:
            v[0] += c.requests
            v[1] += c.prompt_tokens
            v[2] += c.cached_tokens
            v[3] += c.output_tokens
            v[4] += int(c.estimated)
        b.records += 1
        if b.records >= self._cfg.flush_max_records:
            self._wake.set()

    @property
    def pending_records(self) -> int:
        return self._pending.records + (self._in_doubt.records if self._in_doubt is not None else 0)

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the background task and flush what is left (bounded: a dead store cannot hold up a
        shutdown; what could not be written is logged with its size)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_STOP_FLUSH_TIMEOUT_S):
                await self.flush()
        if self.pending_records:
            log.error(
                "usage ledger: %d settled requests could not be written at shutdown", self.pending_records
            )
        await self.store.close()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._cfg.flush_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> bool:
        """Write what is pending now (the batch in doubt first). True when nothing is left."""
        async with self._lock:
            for _ in range(2):
                if self._in_doubt is None:
                    if not self._pending.records:
                        return True
                    self._in_doubt, self._pending = self._pending, self._new_batch()
                batch = self._in_doubt
                try:
                    await self.store.add(batch.id, batch.rows)
                except Exception as err:  # any store failure: keep the batch, retry next time
                    self._m.ledger_flush_errors.inc()
                    if not self._failing:
                        log.warning("usage ledger: flush failed (%s: %s); retrying", type(err).__name__, err)
                    self._failing = True
                    return False
                if self._failing:
                    log.warning("usage ledger: flushing again")
                self._failing = False
                self._in_doubt = None
                self._m.ledger_flushes.inc()
            return not self._pending.records

    async def read(self, tenant: str, start: float, end: float) -> list[Row]:
        """`tenant`'s stored rows for the hours that start in `[start, end)` (Unix seconds)."""
        first = int(start) // HOUR_S * HOUR_S
        if first < start:
            first += HOUR_S
        return await self.store.read(tenant, first, int(end))

    def _collect(self) -> Iterable[Metric]:
        fam = GaugeMetricFamily(
            "kvgate_ledger_records_pending",
            "Settled requests recorded in this gateway's usage ledger buffer and not yet written to the "
            "store (lost if the process dies now).",
        )
        fam.add_metric([], self.pending_records)
        yield fam


assert len(METRICS) == 5  # record() writes the five values in this order
