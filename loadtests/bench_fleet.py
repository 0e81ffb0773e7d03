"""What the benchmark asks of the fleet between and around runs, over its HTTP surface.

- `wait_idle`: every replica reports no running or waiting request and no KV block in use
  (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`).
- `reset_prefix_caches`: `POST /reset_prefix_cache` on every replica, only once the fleet is idle.
  vLLM (and the simulator) refuse a reset while any block is in use, and the HTTP answer does not say
  so (it is 200 either way); so the reset is sent to an idle fleet with nothing else sending (the
  gateway is stopped), re-checked idle afterwards, and retried until that holds. A body of `false`
  (a server that does report the refusal) also counts as refused.
- `SimHealth`: the simulator's own distortion counters (`kvgate_sim_step_lag_seconds`, a histogram in
  WALL seconds of how late engine steps started; `kvgate_sim_clock_jump_seconds_total`, simulated
  seconds skipped because the simulator fell behind), summed over replicas; `sim_health_delta` turns
  two scrapes into a run's figures.
- `GatewayGauges`: the gateway's prefix-index size and admission queueing, from its `/metrics`.

All functions take the caller's `aiohttp.ClientSession`; nothing here holds state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import aiohttp

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = "vllm:kv_cache_usage_perc"
_LAG = "kvgate_sim_step_lag_seconds"
_JUMP = "kvgate_sim_clock_jump_seconds_total"


def _root(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def _samples(text: str, wanted: Iterable[str]) -> dict[str, list[tuple[str, float]]]:
    """Samples of the wanted metric names: name -> [(label text, value)]. Prometheus text format."""
    names = tuple(wanted)
    out: dict[str, list[tuple[str, float]]] = {n: [] for n in names}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        for name in names:
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                labels = line[line.find("{") + 1 : line.rfind("}")] if line[len(name)] == "{" else ""
                value = line[line.rfind("}") + 1 :] if labels else line[len(name) :]
                out[name].append((labels, float(value.split()[0])))
                break
    return out


async def _metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(_root(url) + "/metrics") as resp:
        resp.raise_for_status()
        return await resp.text()


# --- idle and reset ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """A replica's live load: requests running and waiting, KV usage as a fraction 0-1."""

    running: float
    waiting: float
    kv_usage: float

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0 and self.kv_usage == 0


def parse_replica_load(text: str) -> ReplicaLoad:
    """Sum the load gauges of one replica's `/metrics` (over engines and label sets)."""
    s = _samples(text, (_RUNNING, _WAITING, _KV_USAGE))
    return ReplicaLoad(
        running=sum(v for _, v in s[_RUNNING]),
        waiting=sum(v for _, v in s[_WAITING]),
        kv_usage=max((v for _, v in s[_KV_USAGE]), default=0.0),
    )


async def fleet_load(session: aiohttp.ClientSession, urls: Iterable[str]) -> dict[str, ReplicaLoad]:
    """Each replica's live load, keyed by URL (raises on a replica that does not answer)."""
    urls = list(urls)
    texts = await asyncio.gather(*(_metrics_text(session, u) for u in urls))
    return {u: parse_replica_load(t) for u, t in zip(urls, texts, strict=True)}


async def wait_idle(
    session: aiohttp.ClientSession, urls: Iterable[str], *, timeout_s: float = 120.0, poll_s: float = 0.1
) -> None:
    """Return once every replica is idle; TimeoutError naming the busy ones after `timeout_s` (wall)."""
    urls = list(urls)
    deadline = time.monotonic() + timeout_s
    while True:
        loads = await fleet_load(session, urls)
        busy = {u: load for u, load in loads.items() if not load.idle}
        if not busy:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas still busy after {timeout_s:g}s: {busy}")
        await asyncio.sleep(poll_s)


async def reset_prefix_caches(
    session: aiohttp.ClientSession, urls: Iterable[str], *, timeout_s: float = 120.0
) -> int:
    """Empty every replica's prefix cache once the fleet is idle; the number of attempts it took.

    The caller must make sure nothing sends to the fleet meanwhile (stop the gateway first).
    TimeoutError when the fleet does not stay idle long enough within `timeout_s` (wall)."""
    urls = list(urls)
    deadline = time.monotonic() + timeout_s
    attempts = 0
    while True:
        attempts += 1
        await wait_idle(session, urls, timeout_s=max(deadline - time.monotonic(), 0.0))
        answers = await asyncio.gather(*(_post_reset(session, u) for u in urls))
        loads = await fleet_load(session, urls)
        if all(answers) and all(load.idle for load in loads.values()):
            return attempts
        if time.monotonic() > deadline:
            raise TimeoutError(f"prefix caches not reset after {attempts} attempts in {timeout_s:g}s")
        await asyncio.sleep(0.2)


async def _post_reset(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.post(_root(url) + "/reset_prefix_cache") as resp:
        body = (await resp.read()).strip().lower()
        return resp.status == 200 and body not in (b"false", b'"false"')


# --- the simulator's own distortion ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimHealth:
    """Cumulative step-lag histogram (wall seconds; cumulative counts per upper bound) and clock jumps
    (simulated seconds), summed over the replicas scraped."""

    lag_buckets: Mapping[float, float]
    lag_count: float
    lag_sum: float
    clock_jump_s: float


def parse_sim_health(text: str) -> SimHealth:
    s = _samples(text, (_LAG + "_bucket", _LAG + "_count", _LAG + "_sum", _JUMP))
    buckets: dict[float, float] = {}
    for labels, value in s[_LAG + "_bucket"]:
        le = labels.split('le="', 1)[1].split('"', 1)[0] if 'le="' in labels else "+Inf"
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + value
    return SimHealth(
        lag_buckets=buckets,
        lag_count=sum(v for _, v in s[_LAG + "_count"]),
        lag_sum=sum(v for _, v in s[_LAG + "_sum"]),
        clock_jump_s=sum(v for _, v in s[_JUMP]),
    )


def combine(healths: Iterable[SimHealth]) -> SimHealth:
    """Sum several replicas' figures (their histograms share bounds)."""
    buckets: dict[float, float] = {}
    count = total = jump = 0.0
    for h in healths:
        for bound, c in h.lag_buckets.items():
            buckets[bound] = buckets.get(bound, 0.0) + c
        count += h.lag_count
        total += h.lag_sum
        jump += h.clock_jump_s
    return SimHealth(buckets, count, total, jump)


async def scrape_sim_health(session: aiohttp.ClientSession, urls: Iterable[str]) -> SimHealth:
    urls = list(urls)
    texts = await asyncio.gather(*(_metrics_text(session, u) for u in urls))
    return combine(parse_sim_health(t) for t in texts)


@dataclass(frozen=True, slots=True)
class SimHealthDelta:
    """A run's simulator distortion: steps observed, mean and p99 step lag (wall seconds; p99 is the
    upper bound of the bucket holding it, so an over-estimate), clock jumps (simulated seconds)."""

    steps: int
    lag_mean_s: float | None
    lag_p99_s: float | None
    clock_jump_s: float


def sim_health_delta(before: SimHealth, after: SimHealth) -> SimHealthDelta:
    count = after.lag_count - before.lag_count
    if count <= 0:
        return SimHealthDelta(0, None, None, max(after.clock_jump_s - before.clock_jump_s, 0.0))
    bounds = sorted(after.lag_buckets)
    p99: float | None = None
    for bound in bounds:
        if after.lag_buckets[bound] - before.lag_buckets.get(bound, 0.0) >= 0.99 * count:
            p99 = bound
            break
    return SimHealthDelta(
        steps=round(count),
        lag_mean_s=(after.lag_sum - before.lag_sum) / count,
        lag_p99_s=p99,
        clock_jump_s=max(after.clock_jump_s - before.clock_jump_s, 0.0),
    )


# --- the gateway's own gauges ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GatewayGauges:
    """The gateway's prefix index size (block keys over all replicas) and its admission counters
    (requests admitted after queueing, requests rejected), from its `/metrics`."""

    index_keys: float
    queued: float
    rejected: float


def parse_gateway_gauges(text: str) -> GatewayGauges:
    s = _samples(text, ("kvgate_prefix_index_keys", "kvgate_admissions_total", "kvgate_rejections_total"))
    return GatewayGauges(
        index_keys=sum(v for _, v in s["kvgate_prefix_index_keys"]),
        queued=sum(v for labels, v in s["kvgate_admissions_total"] if 'path="queued"' in labels),
        rejected=sum(v for _, v in s["kvgate_rejections_total"]),
    )


async def scrape_gateway_gauges(session: aiohttp.ClientSession, url: str) -> GatewayGauges | None:
    """None when the gateway does not answer (the run's record then leaves the figures out)."""
    try:
        return parse_gateway_gauges(await _metrics_text(session, url))
    except (aiohttp.ClientError, TimeoutError):
        return None
