"""Shadow traffic: a sampled copy of a route's request sent to its mirror target, answer discarded.

A copy is launched once the primary's response has started (its replica answered: the primary is
dispatched and already past its first byte, so nothing here can delay it), as its own task. It is
sheddable, in this order:

- dropped at once (`kvgate_route_mirror_dropped_total{reason}`) when the route already has
  `mirror.max_in_flight` copies running (`concurrency`), when the mirror's pool has no spare room —
  someone is queued, or only the fair-share reserve is left (`saturated`), when no healthy replica
  serves the mirror target (`unavailable`; an adapter with a configured source starts loading, for
  the next copies), or while kvgate shuts down (`shutdown`);
- never queued, never retried on another replica, never charged to the tenant (no rate limit, no
  concurrency slot, no flow-control share); it is counted in the fleet's in-flight numbers (it does
  load the replica) and in the per-variant metrics with `shadow="true"`.

The copy is the primary's upstream body with the mirror's served model name; its answer is read to
the end (streamed or not) and dropped. When the replicas schedule by priority
(`flow_control.pass_priority`), a copy is sent with vLLM `priority` `SHADOW_PRIORITY`, below every
band, so the engines run real requests first and preempt copies before them: a copy shares the
GPU with the primaries, and without this it delays them like any request (docs/benchmarks.md).
Whatever happens to a copy — an error status, a broken or hung stream (bounded by the upstream
timeouts) — is logged at debug and counted, and changes nothing for the client. `stop()` cancels
every copy still running (closing its upstream request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import replace
from typing import Any

import orjson

from gateway.admission import AdmissionQueue
from gateway.errors import GatewayError
from gateway.fleet.state import FleetState
from gateway.forwarder import Dispatch, Forwarder, Outcome
from gateway.model_resolver import Resolution
from gateway.route_metrics import RouteMetrics
from gateway.routing import Router
from policies.types import Band, ReplicaState, RequestInfo

log = logging.getLogger(__name__)

SHADOW_PRIORITY = int(Band.SHEDDABLE) + 1  # vLLM serves lower values first: after every real band


async def _discard(_msg: MutableMapping[str, Any]) -> None:
    return None


class ShadowSender:
    """Shadow copies of one Gateway; one event loop. `bind` the forwarder (and flow control) first."""

    def __init__(
        self,
        fleet: FleetState,
        router: Router,
        metrics: RouteMetrics,
        limits: Mapping[str, int],
        servable: Callable[[Resolution], bool],
        start_load: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
        engine_priority: bool = False,
    ) -> None:
        self._priority = SHADOW_PRIORITY if engine_priority else None
        self._fleet = fleet
        self._router = router
        self._m = metrics
        self._limits = dict(limits)
        self._servable = servable
        self._start_load = start_load
        self._clock = clock
        self._running: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._forwarder: Forwarder | None = None
        self._admission: AdmissionQueue | None = None
        self._closed = False

    def bind(self, forwarder: Forwarder, admission: AdmissionQueue | None) -> None:
        self._forwarder = forwarder
        self._admission = admission

    @property
    def running(self) -> int:
        """Shadow copies in flight now, all routes together."""
        return len(self._tasks)

    def set_limits(self, limits: Mapping[str, int]) -> None:
        self._limits = dict(limits)

    def launch(self, mirror: Resolution, endpoint: str, path: str, body: bytes, primary: RequestInfo) -> None:
        """Send a copy of a request (`primary`, whose upstream body was `body`) to `mirror`, or drop
        it (see the module doc). Returns at once; never raises."""
        route = mirror.route or ""
        reason = self._refusal(mirror, route)
        if reason is not None:
            self._m.mirror_dropped.labels(route, reason).inc()
            return
        self._running[route] = self._running.get(route, 0) + 1
        self._m.begin(route, mirror.target, True)
        task = asyncio.get_running_loop().create_task(self._run(mirror, endpoint, path, body, primary))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refusal(self, mirror: Resolution, route: str) -> str | None:
        if self._closed or self._forwarder is None:
            return "shutdown"
        if self._running.get(route, 0) >= self._limits.get(route, 0):
            return "concurrency"
        if not self._servable(mirror):
            if mirror.adapter is not None:
                self._start_load(mirror.pool, mirror.adapter)
            return "unavailable"
        if self._admission is not None and not self._admission.has_spare_room(mirror.pool):
            return "saturated"
        return None

    async def _run(self, m: Resolution, endpoint: str, path: str, body: bytes, primary: RequestInfo) -> None:
        route = m.route or ""
        t0 = time.perf_counter()
        out = Outcome()
        status = 0
        try:
            status = await self._send(m, endpoint, path, body, primary, out)
        except GatewayError as err:
            status = err.status
        except asyncio.CancelledError:
            status = 499
            raise
        except Exception:
            log.exception("shadow copy to %s failed inside kvgate", m.target)
            status = 500
        finally:
            self._running[route] -= 1
            self._m.done(route, m.target, True, status, t0, out)
            log.debug("shadow copy to %s: status %s (%s)", m.target, status, out.error_kind)

    async def _send(
        self, m: Resolution, endpoint: str, path: str, body: bytes, primary: RequestInfo, out: Outcome
    ) -> int:
        assert self._forwarder is not None
        doc = orjson.loads(body)
        doc["model"] = m.adapter if m.adapter is not None else m.pool
        if self._priority is not None:
            doc["priority"] = self._priority
        facts = await self._router.prompt_facts_async(endpoint, doc, m.pool, m.adapter)
        info = replace(
            primary, model=m.requested, base_model=m.pool, adapter=m.adapter,
            prompt_tokens=facts.prompt_tokens, prefix_keys=facts.prefix_keys,
            prompt_tokens_exact=facts.exact, session_id=None, route=m.route, target=m.target,
            token_bytes=facts.token_bytes, cache_salt=facts.cache_salt,
        )  # fmt: skip
        decision = self._router.decide(info, self._fleet.snapshot(), self._clock()).decision
        if not decision.ranked:
            self._m.mirror_dropped.labels(m.route or "", "unavailable").inc()
            return 503
        tokens = info.reserved_tokens

        def on_attempt(r: ReplicaState) -> None:
            self._fleet.dispatched(r.name, tokens)
            self._router.dispatched(info, r.name)

        def on_attempt_end(r: ReplicaState) -> None:
            self._fleet.finished(r.name, tokens)

        dispatch = Dispatch(
            path=path,
            body=orjson.dumps(doc),
            ranked=decision.ranked[:1],  # never retried elsewhere: a shadow is not worth a second replica
            stream=primary.stream,
            strip_usage=False,
            response_headers=[],
            on_attempt=on_attempt,
            on_attempt_end=on_attempt_end,
            observe_itl=self._m.arm(m.route or "", m.target, True).itl.observe,
        )
        await self._forwarder.forward(dispatch, _discard, out)
        return out.status

    async def stop(self) -> None:
        """Refuse new copies and cancel the running ones (their upstream requests are closed)."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
