"""Graceful drain: what kvgate does between a SIGTERM and its exit.

    serving ──SIGTERM──► propagating ──drain_propagation_s──► refusing ──nothing in flight──► done
                         /ready 503, new requests served      new and queued requests: 503 + Retry-After
                                                              (and Connection: close); in flight: up to
                                                              drain_timeout_s, then cut

- `propagating`: `/ready` answers 503 at once (`/health` stays 200), so load balancers and the
  Kubernetes endpoint controller take this instance out; meanwhile requests still arrive from those
  that have not noticed yet, and they are served as usual.
- `refusing`: a new proxy request, on a new connection or a kept-alive one, is answered 503 with
  `Retry-After` and `Connection: close` (the client retries elsewhere and does not reuse this
  connection); the admission queue refuses its waiters the same way. Requests in flight go on.
- as soon as no request is in flight, the drain is `done`; if some still are after
  `drain_timeout_s`, they are cut: each request's task is cancelled, and the proxy ends a stream
  with an SSE error event and `data: [DONE]`, and answers a request not yet answered with 503
  (gateway/proxy.py). Then the server is told to exit (it closes the listener and the idle
  keep-alive connections, and finishes the lifespan).

The request path pays one attribute read (`refusing`) and a set add and discard per request
(`enter`/`leave`). One event loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.errors import GatewayError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # another instance can take the request now: ask again at once, elsewhere
CUT_GRACE_S = 5.0  # how long cut requests get to write their last bytes and settle
_HEADERS = ((b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close"))


class DrainPhase(enum.Enum):
    SERVING = "serving"
    PROPAGATING = "propagating"
    REFUSING = "refusing"
    DONE = "done"


def shutting_down(detail: str = "kvgate is shutting down") -> GatewayError:
    """A fresh 503 for a request kvgate will not serve because it is draining (one per request: a
    shared exception instance would collect every raiser's traceback)."""
    return GatewayError(503, f"{detail}; please retry (another instance will serve it)", headers=_HEADERS)


class Drain:
    """The drain state of one Gateway (module doc). `refusing` is read on every request."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.phase = DrainPhase.SERVING
        self.refusing = False
        self.cut = False  # requests still in flight were cancelled (`cut_now`)
        self.cut_reason = ""  # why, for the answers that end them
        self.began_at: float | None = None
        self._clock = clock
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle: asyncio.Event | None = None  # set once nothing is in flight, from `refusing` on

    @property
    def draining(self) -> bool:
        return self.phase is not DrainPhase.SERVING

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def enter(self, task: asyncio.Task[Any]) -> None:
        """A proxy request began (its task is cut if it outlasts the drain)."""
        self._tasks.add(task)

    def leave(self, task: asyncio.Task[Any]) -> None:
        """The request's answer has ended, whatever happened."""
        tasks = self._tasks
        tasks.discard(task)
        if not tasks and self._idle is not None:
            self._idle.set()

    def begin(self) -> bool:
        """Turn not ready (`propagating`); False if a drain had already begun."""
        if self.phase is not DrainPhase.SERVING:
            return False
        self.phase = DrainPhase.PROPAGATING
        self.began_at = self._clock()
        return True

    def cut_now(self, reason: str) -> None:
        """End every request in flight now (the drain timeout, or a second SIGTERM), and refuse new
        ones: each request's task is cancelled, and the proxy ends its answer saying `reason`."""
        self.refusing = True
        self.cut = True
        self.cut_reason = reason
        for task in list(self._tasks):
            task.cancel()

    async def run(self, propagation_s: float, timeout_s: float, refuse_waiting: Callable[[], None]) -> int:
        """The whole drain (begins it if not begun). `refuse_waiting` answers the queued requests when
        the propagation window ends. Returns how many requests were cut at the timeout (0: every
        request finished by itself). Returns as soon as nothing is in flight after the window."""
        self.begin()
        log.warning("drain: /ready is 503; new requests are served for %gs more, then refused", propagation_s)
        await asyncio.sleep(propagation_s)
        self.phase = DrainPhase.REFUSING
        self.refusing = True
        refuse_waiting()
        self._idle = asyncio.Event()
        if not self._tasks:
            self._idle.set()
        log.warning(
            "drain: refusing new requests; %d in flight get up to %gs to finish", len(self._tasks), timeout_s
        )
        cut = 0
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            cut = len(self._tasks)
            log.warning("drain: %d requests still in flight after %gs: ending them", cut, timeout_s)
            self.cut_now(f"its {timeout_s:g}s drain timeout ran out")
            try:
                async with asyncio.timeout(CUT_GRACE_S):
                    await self._idle.wait()
            except TimeoutError:
                log.error(
                    "drain: %d requests did not end within %gs of being cut", len(self._tasks), CUT_GRACE_S
                )
        self.phase = DrainPhase.DONE
        began = self.began_at if self.began_at is not None else self._clock()
        log.warning(
            "drain: done after %.1fs (%d requests cut at the drain timeout)", self._clock() - began, cut
        )
        return cut
