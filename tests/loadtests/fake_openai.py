"""A small OpenAI-compatible streaming server for the runner's tests, served by uvicorn on loopback.

Behaviour is chosen by the request's `model`:

- anything not listed below: a normal stream — a role chunk, `max_tokens` content chunks, a
  finish chunk, a usage chunk (prompt_tokens 7, cached_tokens 3), `[DONE]`;
- `overloaded`: 429 with an OpenAI error body; `unavailable`: 503;
- `broken`: two content chunks, then the connection drops (no chunked terminator);
- `error-event`: one content chunk, an error event, `[DONE]`;
- `no-done`: content chunks and usage, then the body ends without `[DONE]`;
- `crlf`: a normal stream framed with `\\r\\n\\r\\n`;
- `hang`: headers, the role chunk, then nothing until the client gives up;
- `late-first`: the role chunk, a pause of `FIRST_TOKEN_DELAY_S`, then a normal stream.

Every request is logged in `FakeState.log` as ("start"|"end", request id header, client port).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FIRST_TOKEN_DELAY_S = 0.05
REPLICA_NAME = "replica-7"


@dataclass
class FakeState:
    log: list[tuple[str, str, int]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    chunk_delay_s: float = 0.0


def _chunk(chat: bool, text: str | None, *, role: bool = False) -> bytes:
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
        obj: dict[str, Any] = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    else:
        obj = {"object": "text_completion", "choices": [{"index": 0, "text": text}]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(completion_tokens: int) -> bytes:
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": completion_tokens,
        "total_tokens": 7 + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    return b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n"


def build_app(state: FakeState) -> Starlette:
    async def complete(request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        body = orjson.loads(await request.body())
        state.bodies.append(body)
        state.headers.append(dict(request.headers))
        rid = request.headers.get("x-test-id", "")
        port = request.client.port if request.client else 0
        model = body.get("model")
        n = int(body.get("max_tokens", 4))
        if model in ("overloaded", "unavailable"):
            status = 429 if model == "overloaded" else 503
            err = {"error": {"message": f"{model}!", "type": "x", "param": None, "code": status}}
            state.log += [("start", rid, port), ("end", rid, port)]
            return JSONResponse(err, status_code=status)

        async def stream() -> AsyncIterator[bytes]:
            state.log.append(("start", rid, port))
            try:
                if chat:
                    yield _chunk(chat, None, role=True)
                if model == "hang":
                    await asyncio.sleep(3600)
                if model == "late-first":
                    await asyncio.sleep(FIRST_TOKEN_DELAY_S)
                count = 2 if model == "broken" else 1 if model == "error-event" else n
                for i in range(count):
                    if state.chunk_delay_s:
                        await asyncio.sleep(state.chunk_delay_s)
                    piece = _chunk(chat, f" w{i}")
                    yield piece.replace(b"\n\n", b"\r\n\r\n") if model == "crlf" else piece
                if model == "broken":
                    raise ConnectionResetError("simulated crash mid-stream")
                if model == "error-event":
                    yield b'data: {"error": {"message": "engine died", "code": 500}}\n\n'
                    yield b"data: [DONE]\n\n"
                    return
                yield _usage(count)
                if model != "no-done":
                    yield b"data: [DONE]\r\n\r\n" if model == "crlf" else b"data: [DONE]\n\n"
            finally:
                state.log.append(("end", rid, port))

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"x-kvgate-replica": REPLICA_NAME}
        )

    async def metrics(request: Request) -> Response:
        return Response(
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0\n'
            'vllm:num_preemptions_total{engine="0",model_name="m"} 2.0\n',
            media_type="text/plain",
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/metrics", metrics),
        ]
    )


@contextlib.asynccontextmanager
async def serve_fake(state: FakeState) -> AsyncIterator[str]:
    """Serve the fake on a free loopback port in the running loop; yields its base URL."""
    config = uvicorn.Config(
        build_app(state), host="127.0.0.1", port=0, log_level="critical", lifespan="off",
        timeout_graceful_shutdown=1,
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
