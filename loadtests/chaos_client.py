"""The chaos benchmark's clients: requests with a watchdog on every wait, and what became of each.

Each request is classified once (`Outcome.kind`):

- `ok`: 200 and, for a stream, `[DONE]` with no error event; for a unary request, a JSON body;
- `stream_error`: a stream that ended with kvgate's SSE error event and `[DONE]` (a replica crashed,
  hung or broke mid-stream: the documented ending, not a failure of kvgate);
- `http_error`: an error status with an OpenAI-shaped JSON error body (429, 503, 502, 504, a replica's
  own 4xx/5xx passed through); `status` says which;
- `client_abort`: this client hung up on purpose (mid-stream, or while waiting for the answer);
- `hung`: a wait outlived its bound (before the answer started: `first_byte_bound_s`; between two
  reads of a started stream: `chunk_bound_s`); the client gives up and counts it;
- `broken`: the connection to kvgate broke, or a body was cut short or malformed;
- `incomplete`: a stream that ended without `[DONE]`;
- `kvgate_500`: a 500 whose body is kvgate's own "internal error" (a bug in kvgate).

`hung`, `broken`, `incomplete` and `kvgate_500` are the benchmark's failures: each should be 0.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import aiohttp
import orjson

from loadtests.sse_stream import SseStream

FAILURE_KINDS = ("hung", "broken", "incomplete", "kvgate_500")


@dataclass(frozen=True, slots=True)
class Bounds:
    """The longest each wait may take before the request counts as hung (seconds)."""

    first_byte_bound_s: float  # request sent -> response headers (queueing, failover, prefill)
    chunk_bound_s: float  # between two reads of a started stream: kvgate's chunk timeout + 1 s
    unary_bound_s: float  # request sent -> the whole unary answer


@dataclass(frozen=True, slots=True)
class Plan:
    """One request to send. `abort_after_chunks` = k: hang up after k reads of the stream (0: while
    waiting for the headers, after `abort_wait_s`); None: read to the end."""

    tenant_key: str
    body: bytes
    stream: bool
    abort_after_chunks: int | None = None
    abort_wait_s: float = 0.0


@dataclass(slots=True)
class Outcome:
    kind: str
    status: int = 0
    seconds: float = 0.0  # send to end (or to giving up)
    max_gap_s: float = 0.0  # the longest wait between two reads once the answer started
    replica: str = ""
    detail: str = ""
    retry_after_s: float | None = None  # a refusal's Retry-After, when it gave one


async def send(session: aiohttp.ClientSession, url: str, plan: Plan, bounds: Bounds) -> Outcome:
    """Send `plan` to `url` (kvgate's /v1/chat/completions) and classify what happened."""
    t0 = time.perf_counter()
    headers = {"authorization": f"Bearer {plan.tenant_key}", "content-type": "application/json"}
    first_bound = bounds.first_byte_bound_s if plan.stream else bounds.unary_bound_s
    out = Outcome("broken")
    try:
        if plan.abort_after_chunks == 0:
            try:
                async with asyncio.timeout(plan.abort_wait_s):
                    resp = await session.post(url, data=plan.body, headers=headers)
            except TimeoutError:
                out.kind = "client_abort"
                return out
            resp.close()
            out.kind = "client_abort"
            out.status = resp.status
            return out
        try:
            async with asyncio.timeout(first_bound):
                resp = await session.post(url, data=plan.body, headers=headers)
                out.status = resp.status
                out.replica = resp.headers.get("x-kvgate-replica", "")
                retry = resp.headers.get("retry-after")
                if retry is not None and retry.isdigit():
                    out.retry_after_s = float(retry)
                if resp.status != 200 or not plan.stream:
                    body = await resp.read()
                    resp.release()
                    _classify_whole(out, resp.status, body)
                    return out
        except TimeoutError:
            out.kind = "hung"
            out.detail = "no response within the first-byte bound"
            return out
        await _read_stream(resp, plan, bounds, out)
        return out
    except (aiohttp.ClientError, ConnectionError) as err:
        out.kind = "broken"
        out.detail = f"{type(err).__name__}: {err}"[:200]
        return out
    finally:
        out.seconds = time.perf_counter() - t0


async def _read_stream(resp: aiohttp.ClientResponse, plan: Plan, bounds: Bounds, out: Outcome) -> None:
    sse = SseStream()  # stops reading events at an error event: `tail` shows what followed it
    tail = b""
    reads = 0
    last = time.perf_counter()
    try:
        while True:
            try:
                async with asyncio.timeout(bounds.chunk_bound_s):
                    data = await resp.content.readany()
            except TimeoutError:
                out.kind = "hung"
                out.detail = f"a stream stalled for over {bounds.chunk_bound_s:g}s after {reads} reads"
                out.max_gap_s = max(out.max_gap_s, time.perf_counter() - last)
                return
            now = time.perf_counter()
            out.max_gap_s = max(out.max_gap_s, now - last)
            last = now
            if not data:
                break
            sse.feed(data, now)
            tail = (tail + data)[-64:]
            reads += 1
            if plan.abort_after_chunks is not None and reads >= plan.abort_after_chunks:
                out.kind = "client_abort"
                return
        sse.finish(time.perf_counter())
    finally:
        resp.close()
    ended = tail.rstrip().endswith(b"data: [DONE]")
    if sse.done and sse.error is None:
        out.kind = "ok"
    elif ended and sse.error is not None and sse.error.startswith("stream-error"):
        out.kind = "stream_error"
        out.detail = sse.error[:200]
    else:
        out.kind = "incomplete"
        out.detail = (sse.error or "")[:200]


def _classify_whole(out: Outcome, status: int, body: bytes) -> None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        out.kind = "broken"
        out.detail = f"status {status} with a body that is not JSON: {body[:80]!r}"
        return
    if status == 200:
        out.kind = "ok" if isinstance(obj, dict) and "choices" in obj else "broken"
        return
    err = obj.get("error") if isinstance(obj, dict) else None
    message = err.get("message", "") if isinstance(err, dict) else ""
    if status == 500 and "internal error in kvgate" in str(message):
        out.kind = "kvgate_500"
    elif isinstance(err, dict) or (isinstance(obj, dict) and obj.get("object") == "error"):
        out.kind = "http_error"
    else:
        out.kind = "broken"
    out.detail = str(message)[:200]


def plan_request(
    rng: random.Random,
    tenant_keys: list[str],
    model: str,
    prompts: list[str],
    *,
    unary_share: float = 0.1,
    abort_share: float = 0.05,
) -> Plan:
    """A random request: one of `prompts` (shared prefixes exercise the routing), 16-96 output
    tokens, a stream most of the time, and sometimes a client that hangs up early."""
    stream = rng.random() >= unary_share
    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": rng.choice(prompts)}],
            "max_tokens": rng.randint(16, 96),
            "stream": stream,
        }
    )
    abort: int | None = None
    wait = 0.0
    if rng.random() < abort_share:
        abort = rng.choice((0, 1, 2, 5, 10)) if stream else 0
        wait = rng.uniform(0.05, 2.0)
    return Plan(rng.choice(tenant_keys), body, stream, abort, wait)
