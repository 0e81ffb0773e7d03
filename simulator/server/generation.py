"""`POST /v1/chat/completions` and `POST /v1/completions`: validate, submit to the driver, stream back.

Per request: one parse, one tokenization, one engine submission and one watcher task that listens for
`http.disconnect` (so a client that leaves aborts its request at once, even while it is still queued).
Per step: the handler wakes once, turns all tokens that arrived into chunks from byte templates, and
writes them in one send. Faults are read once per request.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable

import orjson

from simulator import tokenizer
from simulator.engine import Engine, EngineRequest
from simulator.server.adapters import ModelRegistry
from simulator.server.asgi import (
    EVENT_STREAM,
    Receive,
    Scope,
    Send,
    drop_connection,
    read_body,
    respond,
    respond_error,
)
from simulator.server.bodies import chat_body, completion_body, usage
from simulator.server.driver import EngineDriver, EngineFailed, RequestSink
from simulator.server.errors import ApiError, bad_request
from simulator.server.faults import FaultConfig, FaultState
from simulator.server.openai_schema import GenerationParams, Kind, parse_chat, parse_completion
from simulator.server.sse import DONE, ChunkTemplates, PieceCache, error_chunk
from simulator.server.stops import StopMatcher

_SSE_HEADERS = [(b"content-type", EVENT_STREAM), (b"cache-control", b"no-cache")]
_PARAM = re.compile(r"\(parameter=(\w+)")


class GenerationHandler:
    """The two generation routes of one replica. Holds no per-request state between calls."""

    def __init__(self, engine: Engine, driver: EngineDriver, models: ModelRegistry, faults: FaultState,
                 pieces: PieceCache, *, priority_scheduling: bool) -> None:
        self._engine = engine
        self._driver = driver
        self._models = models
        self._faults = faults
        self._pieces = pieces
        self._priority_scheduling = priority_scheduling

    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handle(scope, receive, send, "chat")

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handle(scope, receive, send, "completion")

    async def _handle(self, scope: Scope, receive: Receive, send: Send, kind: Kind) -> None:
        body = await read_body(receive)
        if body is None:
            return
        faults = self._faults.config
        if faults.hang_after_chunks == 0:
            await _until_disconnect(receive)
            return
        if faults.crash_after_chunks == 0:
            await drop_connection(scope)
            return
        status = self._faults.draw_error()
        if status is not None:
            await respond_error(send, ApiError(status, f"Simulated fault: this replica answers {status} "
                                                       "to a share of requests."))
            return
        try:
            params = parse_chat(body) if kind == "chat" else parse_completion(body)
            adapter = self._models.resolve(params.model)
            prompt_ids = self._prompt_ids(params)
            self._check(params, len(prompt_ids))
        except ApiError as error:
            await respond_error(send, error)
            return

        request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + os.urandom(8).hex()
        stopper = StopMatcher(params.stop) if params.stop else None
        on_token: Callable[[int], bool] | None = None
        if stopper is not None:
            text = self._pieces.text
            feed = stopper.feed
            on_token = lambda token_id: feed(text(token_id))  # noqa: E731
        request = EngineRequest(request_id=request_id, prompt_token_ids=prompt_ids,
                                max_tokens=params.max_tokens, adapter=adapter, priority=params.priority,
                                seed=params.seed or 0, adapter_id=self._models.lora_int_id(adapter))
        try:
            sink = self._driver.submit(request, on_token)
        except EngineFailed:
            await respond_error(send, ApiError(500, "The simulated engine has failed."))
            return
        watcher = asyncio.ensure_future(_abort_on_disconnect(receive, self._driver, request_id))
        try:
            call = _Call(kind, request_id, params, len(prompt_ids), stopper, faults)
            if params.stream:
                await self._stream(call, sink, scope, send, watcher)
            else:
                await self._complete(call, sink, scope, send, watcher)
        finally:
            watcher.cancel()
            if not sink.done:
                self._driver.abort(request_id)

    def _prompt_ids(self, params: GenerationParams) -> list[int]:
        if params.prompt_token_ids is not None:
            ids = list(params.prompt_token_ids)
        elif params.messages is not None:
            ids = tokenizer.encode(tokenizer.render_chat(
                [{"role": m.role, "content": m.content} for m in params.messages]))
        else:
            ids = tokenizer.encode(params.prompt_text or "")
        if not ids:
            raise bad_request("The decoder prompt cannot be empty", "prompt")
        return ids

    def _check(self, params: GenerationParams, prompt_tokens: int) -> None:
        message = self._engine.validate(prompt_tokens, params.max_tokens)
        if message is not None:
            found = _PARAM.search(message)
            raise bad_request(message, found.group(1) if found else None)
        if params.priority != 0 and not self._priority_scheduling:
            raise bad_request(f"Got priority {params.priority} but Priority scheduling is not enabled.",
                              "priority")

    async def _stream(self, call: _Call, sink: RequestSink, scope: Scope, send: Send,
                      watcher: asyncio.Future[None]) -> None:
        t = ChunkTemplates(call.kind, call.request_id, int(time.time()), call.model(self._models))
        pieces, stopper = self._pieces, call.stopper
        limit = call.chunk_limit
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        sent = produced = emitted = 0
        role = t.role
        while True:
            events = await sink.take()
            reason = sink.reason
            if reason == "abort":
                return  # the client left (or the replica stops): nobody to write to
            done = reason is not None
            chunks: list[bytes] = []
            if role is not None and (events or done):
                chunks.append(role)
                role = None
            produced += len(events)
            if stopper is None:
                head, tail, json = t.head, t.tail, pieces.json
                for event in events:
                    if event.finished_reason is None:
                        chunks.append(head + json(event.token_id) + tail)
                    else:
                        chunks.append(head + json(event.token_id) + t.last_tail(event.finished_reason, None))
            elif events or done:
                end = len(stopper.text) if done else stopper.safe_len
                piece = stopper.text[emitted:end]
                emitted = end
                if done and reason != "error":
                    finish, stop_reason = _stop_outcome(sink, stopper)
                    chunks.append(t.head + _json_str(piece) + t.last_tail(finish, stop_reason))
                elif piece:
                    chunks.append(t.head + _json_str(piece) + t.tail)
            if done:
                if reason == "error":
                    chunks.append(error_chunk(ApiError(500, "The simulated engine failed.").body()))
                elif call.params.include_usage:
                    chunks.append(t.usage(call.prompt_tokens, produced, _cached(sink)))
                chunks.append(DONE)
            if limit is not None and sent + len(chunks) >= limit:
                await send({"type": "http.response.body", "body": b"".join(chunks[: limit - sent]),
                            "more_body": True})
                await self._break(call, scope, watcher)
                return
            sent += len(chunks)
            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": not done})
            if done:
                return

    async def _complete(self, call: _Call, sink: RequestSink, scope: Scope, send: Send,
                        watcher: asyncio.Future[None]) -> None:
        ids: list[int] = []
        limit = call.chunk_limit
        while True:
            events = await sink.take()
            ids.extend(event.token_id for event in events)
            if limit is not None and len(ids) >= limit:
                await self._break(call, scope, watcher)
                return
            if sink.done:
                break
        if sink.reason == "abort":
            return
        if sink.reason == "error":
            await respond_error(send, ApiError(500, "The simulated engine failed."))
            return
        stopper = call.stopper
        if stopper is not None:
            text = stopper.text
            reason, stop_reason = _stop_outcome(sink, stopper)
        else:
            text = "".join(map(self._pieces.text, ids))
            reason, stop_reason = sink.reason or "length", None
        build = chat_body if call.kind == "chat" else completion_body
        body = build(call.request_id, int(time.time()), call.model(self._models), text, reason, stop_reason,
                     usage(call.prompt_tokens, len(ids), _cached(sink)))
        await respond(send, 200, body)

    async def _break(self, call: _Call, scope: Scope, watcher: asyncio.Future[None]) -> None:
        """The crash or hang fault, after the allowed chunks went out."""
        self._driver.abort(call.request_id)
        if call.faults.crash_after_chunks is not None:
            await drop_connection(scope)
        else:
            await watcher  # hang: answer nothing more until the client gives up


class _Call:
    """What one generation request's response needs beyond its sink."""

    __slots__ = ("chunk_limit", "faults", "kind", "params", "prompt_tokens", "request_id", "stopper")

    def __init__(self, kind: Kind, request_id: str, params: GenerationParams, prompt_tokens: int,
                 stopper: StopMatcher | None, faults: FaultConfig) -> None:
        self.kind = kind
        self.request_id = request_id
        self.params = params
        self.prompt_tokens = prompt_tokens
        self.stopper = stopper
        self.faults = faults
        limits = [k for k in (faults.crash_after_chunks, faults.hang_after_chunks) if k is not None]
        self.chunk_limit = min(limits) if limits else None

    def model(self, models: ModelRegistry) -> str:
        return self.params.model or models.base_model


def _stop_outcome(sink: RequestSink, stopper: StopMatcher) -> tuple[str, str | None]:
    if stopper.matched is not None:
        return "stop", stopper.matched
    return sink.reason or "length", None


def _cached(sink: RequestSink) -> int:
    return sink.finished.cached_tokens if sink.finished is not None else 0


def _json_str(text: str) -> bytes:
    return orjson.dumps(text)


async def _abort_on_disconnect(receive: Receive, driver: EngineDriver, request_id: str) -> None:
    await _until_disconnect(receive)
    driver.abort(request_id)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
