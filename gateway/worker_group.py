"""One worker of a kvgate running several processes (`server.workers`), and how it reaches its siblings.

The supervisor (gateway/supervisor.py) starts each worker as `kvgate serve` with four environment
variables (`WorkerSlot`): its index, the number of workers, a private directory (mode 0700, made by
the supervisor and removed when it exits) and the supervisor's pid. A worker listens, besides the
shared port, on a Unix socket of its own in that directory: the worker channel. One JSON line in,
one JSON answer out, then the connection closes. Operations:

    metrics   this worker's samples (gateway/worker_metrics.py), also saved to metrics-w<i>.json
    reload    read the config file again (gateway/reload.py); answers the ReloadResult
    drain     {"replica", "drained": bool}: drain or undrain a replica (as the admin API does)
    drained   the replicas drained through the admin API here (a restarted worker catches up)

What goes through the channel is what a request to one worker must change or read in all of them
and that no shared store carries: a config reload (the file is this machine's), a replica drain,
and the metrics. Keys, tenants' limits and route weights already reach every process through Redis
(gateway/policy_sync.py, gateway/route_overrides.py), as they reach other gateways.

What each worker keeps to itself: its fleet picture (it scrapes every replica itself, every
`fleet.scrape_interval_s`), its in-flight counts per replica, its prefix index (built from the
requests it routed), its admission queues and its connections. N workers are N gateways as far as
routing knows: none sees what the others sent between two scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily

from gateway import worker_metrics as wm
from gateway.atomic_file import write_atomic

if TYPE_CHECKING:
    from gateway.gateway import Gateway

log = logging.getLogger(__name__)

ENV_INDEX, ENV_COUNT = "KVGATE_WORKER_INDEX", "KVGATE_WORKERS"
ENV_DIR, ENV_PARENT = "KVGATE_WORKER_DIR", "KVGATE_WORKER_PARENT"
TIMEOUTS_S = {"metrics": 2.0, "drain": 2.0, "drained": 2.0, "reload": 30.0}
_MAX_REQUEST = 64 * 1024
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    index: int
    count: int
    dir: Path
    parent: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> WorkerSlot | None:
        """This process's slot when the supervisor started it; None for a single-process kvgate."""
        if ENV_INDEX not in env:
            return None
        return cls(int(env[ENV_INDEX]), int(env[ENV_COUNT]), Path(env[ENV_DIR]), int(env[ENV_PARENT]))

    def env(self) -> dict[str, str]:
        return {
            ENV_INDEX: str(self.index),
            ENV_COUNT: str(self.count),
            ENV_DIR: str(self.dir),
            ENV_PARENT: str(self.parent),
        }

    def socket(self, index: int) -> Path:
        return self.dir / f"w{index}.sock"

    def snapshot(self, index: int) -> Path:
        return self.dir / f"metrics-w{index}.json"


def die_with_parent(slot: WorkerSlot) -> bool:
    """Ask the kernel for SIGTERM (a graceful drain) when the supervisor dies, even by SIGKILL, so
    no worker outlives it (Linux). False if the supervisor is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == slot.parent


async def call(path: Path, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """One exchange on a worker channel; None when the worker does not answer in time (or at all)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            data = await reader.read()
        answer = json.loads(data)
        return answer if isinstance(answer, dict) else None
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class WorkerGroup:
    """This worker's side of the group: the channel it serves, and the calls to its siblings."""

    def __init__(self, slot: WorkerSlot) -> None:
        self.slot = slot
        self._gw: Gateway | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def index(self) -> int:
        return self.slot.index

    async def start(self, gw: Gateway) -> None:
        """Catch up with the siblings' replica drains, then serve the channel."""
        self._gw = gw
        for answer in (await self.relay("drained", {})).values():
            for name in answer.get("replicas", []) if answer else ():
                with contextlib.suppress(KeyError):
                    gw.fleet.drain(name)
        path = self.slot.socket(self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by this slot's previous process
        self._server = await asyncio.start_unix_server(self._serve, str(path), limit=_MAX_REQUEST)

    async def stop(self) -> None:
        """Close the channel and save this worker's last samples (they count on after its exit)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self._gw is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._save, wm.local_families(self._gw.metrics.registry))

    async def relay(self, op: str, body: dict[str, Any]) -> dict[int, dict[str, Any] | None]:
        """Send `op` to every sibling at once; each one's answer, None for one that did not answer."""
        others = [i for i in range(self.slot.count) if i != self.index]
        request = {"op": op, **body}
        answers = await asyncio.gather(*(call(self.slot.socket(i), request, TIMEOUTS_S[op]) for i in others))
        return dict(zip(others, answers, strict=True))

    async def confirm(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """`relay` for a change: which workers applied it (this one included) and which did not."""
        answers = await self.relay(op, body)
        done = [self.index] + [i for i, a in answers.items() if a is not None and a.get("ok")]
        return {
            "count": self.slot.count,
            "confirmed": sorted(done),
            "pending": sorted(i for i, a in answers.items() if a is None or not a.get("ok")),
        }

    # -- metrics ----------------------------------------------------------------------------------

    def _save(self, families: list[wm.Family]) -> None:
        write_atomic(self.slot.snapshot(self.index), wm.dumps(families, os.getpid()))

    async def scrape(self) -> bytes:
        """Every worker's metrics merged (gateway/worker_metrics.py), for GET /metrics."""
        assert self._gw is not None
        own = wm.local_families(self._gw.metrics.registry)
        answers = await self.relay("metrics", {})
        live, exited, late = await asyncio.to_thread(self._gather_files, own, answers)
        families = wm.merge(live, exited)
        workers = GaugeMetricFamily(
            "kvgate_workers",
            "Worker processes in this scrape: answered, late (counted from the samples they gave "
            "last), exited (processes that ended: their counters still count).",
            labels=["state"],
        )
        workers.add_metric(["answered"], len(live) - late)
        workers.add_metric(["late"], late)
        workers.add_metric(["exited"], len(exited))
        families.append(wm.families_of([workers])[0])
        return wm.render(families)

    def _gather_files(
        self, own: list[wm.Family], answers: dict[int, dict[str, Any] | None]
    ) -> tuple[list[list[wm.Family]], list[list[wm.Family]], int]:
        """(live workers' families, exited workers' families, how many live ones were late);
        blocking (reads and writes the directory's small files)."""
        self._save(own)
        live, late = [own], 0
        for i, answer in answers.items():
            if answer is not None:
                live.append(answer["families"])
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                live.append(wm.loads(self.slot.snapshot(i).read_bytes())[1])
                late += 1
        exited = []
        for path in sorted(self.slot.dir.glob("exited-*.json")):
            with contextlib.suppress(OSError, ValueError, KeyError):
                exited.append(wm.loads(path.read_bytes())[1])
        return live, exited, late

    # -- the channel ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), TIMEOUTS_S["metrics"])
            request = json.loads(line)
            answer = await self._answer(request)
            writer.write(json.dumps(answer).encode())
            await writer.drain()
        except Exception:  # a broken exchange is the caller's "no answer"; this worker goes on
            log.exception("worker channel: a request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        gw = self._gw
        assert gw is not None
        op = request.get("op")
        if op == "metrics":
            families = wm.local_families(gw.metrics.registry)
            await asyncio.to_thread(self._save, families)
            return {"ok": True, "pid": os.getpid(), "families": families}
        if op == "reload":
            res = await gw.reloader.reload(f"admin via worker {request.get('from', '?')}")
            return {"ok": res.ok, "generation": res.generation, "hash": res.digest, "message": res.message}
        if op == "drain":
            name, drained = str(request.get("replica")), bool(request.get("drained"))
            try:
                gw.fleet.drain(name) if drained else gw.fleet.undrain(name)
            except KeyError:
                return {"ok": False, "message": f"no replica named {name!r} here"}
            return {"ok": True}
        if op == "drained":
            return {"ok": True, "replicas": [n for n in gw.fleet.names() if gw.fleet.drained(n)]}
        return {"ok": False, "message": f"unknown operation {op!r}"}
