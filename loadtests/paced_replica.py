"""A replica that streams at a fixed pace and does nothing else: the upstream of the paced overhead
benchmark (loadtests/overhead_bench.py --pace-ms).

    python -m loadtests.paced_replica --port 0 --pace-ms 10 [--model tiny-llama]   # prints its URL

Why not the simulator: the simulator models an engine (a batch, a KV cache, a step time from a
roofline), which is the point of it everywhere else, and costs CPU per step and per sequence; 200
streams paced 10 ms apart are 20,000 chunks a second, and on this machine its core is shared with
the load generator. Here a stream is a role chunk at once, then `max_tokens` content chunks, one
every `pace_ms`, as a decoding engine delivers them (vLLM-shaped chat or completion chunks), a usage
chunk and `[DONE]`: one timer and one write per chunk. Enough of vLLM's surface for kvgate to route
to it: `/v1/models`, `/health`, and `/metrics` with the running-requests gauge (the streams open
now), an empty queue and a constant KV usage.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import orjson
from aiohttp import web

_METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="{model}"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="{model}"}} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="{model}"}} 0.1
"""


class PacedReplica:
    def __init__(self, model: str, pace_s: float) -> None:
        self.model = model
        self.pace_s = pace_s
        self.running = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, _: web.Request) -> web.Response:
        body = {"object": "list", "data": [{"id": self.model, "object": "model", "parent": None}]}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=_METRICS.format(model=self.model, running=self.running))

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens") or 16)
        head = {"id": "cmpl-paced", "created": int(time.time()), "model": self.model}
        if chat:
            head["object"] = "chat.completion.chunk"
            first = _event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            token = _event({**head, "choices": [{"index": 0, "delta": {"content": " the"}}]})
        else:
            head["object"] = "text_completion"
            first = b""
            token = _event({**head, "choices": [{"index": 0, "text": " the"}]})
        usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}
        last = _event({**head, "choices": [], "usage": usage}) + b"data: [DONE]\n\n"
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        self.running += 1
        try:
            await resp.prepare(request)
            await resp.write(first + token)  # the first token at once: TTFT is the path's own
            for _ in range(n - 1):
                await asyncio.sleep(self.pace_s)
                await resp.write(token)
            await resp.write(last)
            await resp.write_eof()
        finally:
            self.running -= 1
        return resp


def _event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def serve(args: argparse.Namespace) -> None:
    replica = PacedReplica(args.model, args.pace_ms / 1000)
    runner = web.AppRunner(replica.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"http://{args.host}:{port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--pace-ms", type=float, default=10.0, help="time between two chunks of a stream")
    p.add_argument("--model", default="tiny-llama")
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
