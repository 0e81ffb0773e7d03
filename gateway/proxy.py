"""The two proxy endpoints, `/v1/chat/completions` and `/v1/completions`, as raw ASGI apps.

One request: authenticate (401, from the headers, before a byte of the body is read), read the body
(413), parse (400), resolve the model — a route's target, a base model or an adapter, loading an
adapter no replica holds (404, 403/400 for the override header, 503) — and check the tenant's
allow-list against the route and the target by canonical name (403), reserve rate limits
(429), pass flow control (queue, or 503 with Retry-After), pick a replica, forward and relay, then
settle the tenant's tokens against the real usage and record metrics — whatever happened, including
the client hanging up mid-way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from gateway.asgi_io import (
    ClientGone,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_error,
)
from gateway.drain import shutting_down
from gateway.errors import GatewayError, bad_request
from gateway.forwarder import _DONE, Dispatch, Outcome
from gateway.model_resolver import Resolution
from gateway.request_parse import Endpoint, ParsedRequest, parse_request
from policies.tenancy import reserved_output_tokens
from policies.types import ReplicaState, RequestInfo

if TYPE_CHECKING:
    from gateway.config_snapshot import ConfigSnapshot
    from gateway.gateway import Gateway
    from gateway.tenancy import Admitted

log = logging.getLogger(__name__)

# A message, not a shared GatewayError: each raise of one instance chains that request's traceback
# (frames holding the body) onto it, so memory grew for as long as no replica could serve.
_NO_REPLICA = "no replica can serve this model right now"


class ProxyEndpoint:
    """ASGI app for one OpenAI endpoint. Holds only references; all state lives in the Gateway."""

    def __init__(self, gateway: Gateway, endpoint: Endpoint, path: str) -> None:
        self.gw = gateway
        self.endpoint: Endpoint = endpoint
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        rid = (b"x-request-id", gw.request_ids.accept_or_new(header(scope, b"x-request-id")))
        if scope["method"] != "POST":
            await send_error(send, GatewayError(405, f"use POST for {self.path}"), (rid,))
            return
        drain = gw.drain
        if drain.refusing:  # draining, past the propagation window (gateway/drain.py)
            gw.metrics.rejections.labels("unknown", "draining").inc()
            await send_error(send, shutting_down(), (rid,))
            return
        snap = gw.snapshot  # this request's config, kept to its end whatever a reload does
        t0 = time.perf_counter()
        model_label = "unknown"
        status = 0
        progress = Outcome()  # filled by the forwarder as it goes: survives a cancelled request
        admitted: Admitted | None = None
        res: Resolution | None = None
        extra_headers: list[tuple[bytes, bytes]] = [rid]
        watch: DisconnectWatch | None = None
        tenant_name: str | None = None
        req: ParsedRequest | None = None
        task = asyncio.current_task()
        assert task is not None
        gw.metrics.in_flight.inc()
        drain.enter(task)
        try:
            # The key is in the headers: an unauthenticated client never makes kvgate buffer a body.
            tenant = gw.tenancy.authenticate(header(scope, b"authorization"))
            tenant_name = tenant.name
            raw = await read_body(scope, receive, snap.config.server.max_body_bytes)
            req = parse_request(raw, self.endpoint)
            res = gw.model_routes.resolve(req, tenant.name, scope)
            model_label = res.pool
            if res.route is not None:
                gw.tenancy.check_model(tenant, res.route)
            gw.tenancy.check_model(tenant, res.target)  # canonical: "base:*" matches an adapter
            cap = gw.tenancy.output_cap(tenant)
            if cap is not None and req.max_tokens is not None and req.max_tokens > cap:
                raise bad_request(
                    f"max_tokens={req.max_tokens} is over this key's limit of {cap} output tokens",
                    "max_tokens",
                )
            watch = DisconnectWatch(receive, task)
            if not gw.model_routes.ready(res):  # an adapter to load, or the route's fallback
                res = await gw.model_routes.place(res)
                model_label = res.pool
                gw.tenancy.check_model(tenant, res.target)
            info = await self._request_info(req, res, tenant.name, scope, snap)
            admitted = await gw.tenancy.admit(
                tenant, info, header(scope, b"x-kvgate-priority"), header(scope, b"x-kvgate-ttft-slo-ms")
            )
            info = admitted.info
            extra_headers = [rid, *admitted.headers]
            await self._route_and_forward(
                req, raw, info, admitted, send, watch, progress, cap, rid, res, snap
            )
            status = progress.status
        except GatewayError as err:
            status = err.status
            if progress.status == 0:
                await send_error(send, err, extra_headers)
        except ClientGone:
            status = 499
        except asyncio.CancelledError:
            if watch is not None and watch.gone:
                task.uncancel()
                status = 499
                gw.metrics.client_disconnects.inc()
            elif drain.cut:  # still in flight at the drain timeout
                task.uncancel()
                why = f"kvgate is shutting down ({drain.cut_reason})"
                stream = req is not None and req.stream
                status = await _end_cut(send, watch, progress, extra_headers, stream, why, snap)
            else:
                raise
        except Exception:
            # A bug, not the client's doing: answer in OpenAI's shape and still settle the tenant.
            log.exception("unexpected error on %s", self.path)
            status = 500
            if progress.status == 0:
                await send_error(send, GatewayError(500, "internal error in kvgate"), extra_headers)
        finally:
            if watch is not None:
                watch.close()
            gw.metrics.in_flight.dec()
            drain.leave(task)
        if progress.slow_client:
            await _drop_connection(scope)
        await self._account(model_label, status, t0, admitted, progress)
        if res is not None:
            gw.model_routes.done(res, status, t0, progress)
        if gw.access_log.enabled:
            gw.access_log.write(
                request_id=rid[1],
                path=self.path,
                tenant=tenant_name,
                model=req.model if req is not None else None,
                pool=model_label if req is not None else None,
                status=499 if progress.slow_client else status,
                stream=req.stream if req is not None else False,
                outcome=progress,
                started=t0,
                ended=time.perf_counter(),
                route=res.route if res is not None else None,
                target=res.target if res is not None else None,
            )

    async def _request_info(
        self, req: ParsedRequest, res: Resolution, tenant: str, scope: Scope, snap: ConfigSnapshot
    ) -> RequestInfo:
        gw = self.gw
        base, adapter = res.pool, res.adapter
        facts = await gw.router.prompt_facts_async(self.endpoint, req.body, base, adapter)
        max_tokens = req.max_tokens if req.max_tokens is not None else gw.tenancy.default_max_tokens(tenant)
        session = header(scope, snap.session_header)
        return RequestInfo(
            model=req.model,
            base_model=base,
            adapter=adapter,
            prompt_tokens=facts.prompt_tokens,
            max_tokens=reserved_output_tokens(max_tokens, req.n, req.prompts),
            stream=req.stream,
            tenant=tenant,
            session_id=session.decode("latin-1") if session else None,
            prefix_keys=facts.prefix_keys,
            prompt_tokens_exact=facts.exact,
            route=res.route,
            target=res.target,
            token_bytes=facts.token_bytes,
            cache_salt=facts.cache_salt,
        )

    async def _route_and_forward(
        self,
        req: ParsedRequest,
        raw: bytes,
        info: RequestInfo,
        admitted: Admitted,
        send: Send,
        watch: DisconnectWatch,
        progress: Outcome,
        output_cap: int | None,
        rid: tuple[bytes, bytes],
        res: Resolution,
        snap: ConfigSnapshot,
    ) -> Outcome:
        gw = self.gw
        t = time.perf_counter()
        routed = gw.router.decide(info, gw.fleet.snapshot(), gw.clock())
        gw.metrics.decision_seconds.observe(time.perf_counter() - t)
        decision = routed.decision
        if not decision.ranked:
            raise GatewayError(503, _NO_REPLICA)
        winner = decision.ranked[0].name
        if info.prefix_keys:
            gw.metrics.prefix_match.observe(routed.match.get(winner, 0) / len(info.prefix_keys))
        headers = [rid, *admitted.headers, (b"x-kvgate-target", res.header)]
        if snap.config.server.debug_headers:
            predicted = gw.router.predicted_ttfts(info, routed, gw.clock())
            headers.append((b"x-kvgate-route", route_header(decision, winner, predicted)))

        tokens = info.reserved_tokens
        latency = gw.latency
        match = routed.match
        attempt: list[Any] = [None, 0.0, False]  # this attempt's latency ticket, its start, first chunk

        def on_attempt(r: ReplicaState) -> None:
            # The ticket first: the index learns this prompt below, and the ticket's uncached tokens
            # are what the replica was believed to hold at the decision.
            live = gw.fleet.snapshot().by_name(r.name) or r
            ticket = gw.router.predict(info, live, match.get(r.name, 0), gw.clock())
            ticket = latency.dispatch(ticket, None if req.stream else gw.clock())
            attempt[:] = [ticket, time.perf_counter(), False]
            progress.predicted_ttft_s = ticket.ttft_s
            gw.fleet.dispatched(r.name, tokens)
            gw.router.dispatched(info, r.name)
            gw.metrics.dispatched_to(r.name)
            if res.adapter is not None:
                gw.model_routes.dispatched(res, r.name)

        def on_first_chunk(r: ReplicaState) -> None:
            attempt[2] = True
            progress.ttft_error = latency.first_token(attempt[0], time.perf_counter() - attempt[1])
            gw.router.latency.step_seen(r.name, gw.clock())
            if gw.tenancy.admission is not None:  # the work ahead shrank: the latency gate may open
                gw.tenancy.admission.on_prefilled(info.base_model)

        itl = gw.model_routes.itl_observer(res, gw.metrics.for_model(info.base_model).itl.observe)
        step_seen = gw.router.latency.step_seen
        clock = gw.clock

        def observe_itl(gap: float) -> None:
            itl(gap)
            step_seen(attempt[0].replica, clock())  # a step of that replica just ended

        def on_attempt_end(r: ReplicaState) -> None:
            gw.fleet.finished(r.name, tokens)
            if res.adapter is not None:
                gw.model_routes.finished(res, r.name)
            latency.ended(attempt[0], attempt[2], _tpot(progress) if attempt[2] else None, gw.clock())
            usage = progress.usage
            if usage is not None and usage.completion_tokens:  # the pool's request mix (headroom)
                ticket = attempt[0]
                prompt = usage.prompt_tokens
                uncached = prompt - usage.cached_tokens if usage.cached_tokens else ticket.uncached_tokens
                gw.headroom.observe(ticket.pool, prompt, min(uncached, prompt), usage.completion_tokens)

        async def guarded_send(msg: MutableMapping[str, Any]) -> None:
            if msg["type"] == "http.response.body" and not msg.get("more_body", False):
                watch.finish()
            await send(msg)

        body = self._upstream_body(req, raw, admitted.vllm_priority, output_cap, res.upstream_model)
        out_send: Any = guarded_send
        if res.mirror is not None:  # sampled for a shadow copy: sent once the answer has started

            async def out_send(msg: MutableMapping[str, Any]) -> None:
                if msg["type"] == "http.response.start":
                    gw.model_routes.launch_mirror(res, self.endpoint, self.path, body, info)
                await guarded_send(msg)

        dispatch = Dispatch(
            path=self.path,
            body=body,
            ranked=decision.ranked,
            stream=req.stream,
            strip_usage=req.stream and not req.include_usage,
            response_headers=headers,
            on_attempt=on_attempt,
            on_attempt_end=on_attempt_end,
            observe_itl=observe_itl,
            on_first_chunk=on_first_chunk,
            upstream_headers=(rid,),
            rerank=lambda: gw.router.decide(info, gw.fleet.snapshot(), gw.clock()).decision.ranked,
            rewrite=res.rewrite,
        )
        return await gw.forwarder.forward(dispatch, out_send, progress)

    def _upstream_body(
        self,
        req: ParsedRequest,
        raw: bytes,
        vllm_priority: int | None,
        output_cap: int | None,
        model: str | None = None,
    ) -> bytes:
        """The body for the replica: untouched unless kvgate must ask for usage, set priority, bound
        the output to the tenant's cap or name the model as the replica serves it (`model`: a route's
        target, an adapter's served name for its canonical one)."""
        body = req.body
        changed = False
        if model is not None:
            body = {**body, "model": model}
            changed = True
        if output_cap is not None and req.max_tokens is None:
            body = {**body, "max_tokens": output_cap}
            changed = True
        if req.stream and not req.include_usage:
            opts = dict(body.get("stream_options") or {})
            opts["include_usage"] = True
            body = {**body, "stream_options": opts}
            changed = True
        if vllm_priority is not None or req.has_priority:
            # A client never sets the engine priority itself: that would jump the fair queue.
            body = {k: v for k, v in body.items() if k != "priority"}
            if vllm_priority is not None:
                body["priority"] = vllm_priority
            changed = True
        if not changed:
            return raw
        return orjson.dumps(body)

    async def _account(
        self,
        model: str,
        status: int,
        t0: float,
        admitted: Admitted | None,
        progress: Outcome,
    ) -> None:
        """Metrics and settlement for every request, however it ended. `progress` is what the
        forwarder got done (the same object it returns), so a cancelled stream counts too. The
        inter-chunk latency is observed by the forwarder as the stream goes."""
        gw = self.gw
        m = gw.metrics
        p = progress
        if p.slow_client:
            status = 499  # kvgate dropped a client that stopped reading: the client's doing
        m.request_done(model, status)
        # access log: route/target are admitted.info.route / .target (RequestInfo), or __call__'s `res`
        if p.first_byte_at is not None:
            mm = m.for_model(model)
            mm.ttft.observe(p.first_byte_at - t0)
            if p.ended_at is not None:
                mm.e2e.observe(p.ended_at - t0)
        if admitted is not None:
            await gw.tenancy.settle(admitted, p.usage, p)
            usage = p.usage
            if usage is not None:
                m.tokens_used(
                    model,
                    admitted.info.tenant,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.cached_tokens,
                )


async def _end_cut(
    send: Send,
    watch: DisconnectWatch | None,
    progress: Outcome,
    headers: list[tuple[bytes, bytes]],
    stream: bool,
    why: str,
    snap: ConfigSnapshot,
) -> int:
    """End a request the drain cut (gateway/drain.py) and return the status to record: a stream
    under way gets an SSE error event and `data: [DONE]` (the forwarder's ending for a broken stream;
    its replica request was closed, which aborts it there), a request not yet answered a 503 with
    Retry-After. A whole answer cut between its head and its body is left unfinished (the server
    closes the connection)."""
    if watch is not None:
        watch.finish()
    progress.error_kind = "drain_cut"
    try:
        async with asyncio.timeout(snap.config.server.send_timeout_s):
            if progress.status == 0:
                await send_error(send, shutting_down(why), headers)
                return 503
            if stream and progress.ended_at is None and not progress.slow_client:
                err = GatewayError(503, f"{why}: the stream was ended")
                await send(
                    {"type": "http.response.body", "body": err.sse_event() + _DONE, "more_body": False}
                )
                progress.ended_at = time.perf_counter()
    except TimeoutError:
        progress.slow_client = True  # dropped below, like any client that stopped reading
    return progress.status


async def _drop_connection(scope: Scope) -> None:
    """Abort a client connection that stopped reading (its response is left unfinished): closing it
    gracefully would wait for the client to read what is buffered, which it does not. The server's
    protocol puts the hook in the scope (gateway/http_protocol.py); the yield lets the loss of the
    connection be seen before the app returns, so the server does not log an unfinished response."""
    abort = scope.get("kvgate.abort")
    if abort is not None:
        abort()
        await asyncio.sleep(0)


def route_header(decision: Any, replica: str, predicted: Sequence[tuple[str, float]] = ()) -> bytes:
    """`x-kvgate-route`: the winner's per-scorer scores and total, then the predicted TTFT (ms) of the
    winner (`ttft_ms`) and of the runner-up (`runner_up`, `runner_up_ttft_ms`) when `predicted` has
    them ((replica, seconds), best first)."""
    scores = decision.scores.get(replica, {})
    parts = [f"replica={replica}"] + [f"{k}={v:.3f}" for k, v in scores.items()]
    total = decision.total.get(replica)
    if total is not None:
        parts.append(f"total={total:.3f}")
    if predicted:
        parts.append(f"ttft_ms={predicted[0][1] * 1000:.1f}")
        if len(predicted) > 1:
            parts.append(f"runner_up={predicted[1][0]};runner_up_ttft_ms={predicted[1][1] * 1000:.1f}")
    return ";".join(parts).encode()


def _tpot(out: Outcome) -> float | None:
    """A stream's mean seconds per output token after the first, when it ended whole with >= 2."""
    usage = out.usage
    if out.first_byte_at is None or out.ended_at is None or usage is None or usage.completion_tokens < 2:
        return None
    return (out.ended_at - out.first_byte_at) / (usage.completion_tokens - 1)
