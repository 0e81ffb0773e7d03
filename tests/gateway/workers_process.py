"""`kvgate serve --workers N` as real processes for the tests: the supervisor and its workers.

    async with kvgate_workers(tmp_path, config, workers=2) as kv:   # /health answers
        kv.workers()                       # the worker pids now (children of the supervisor)
        await each_worker(kv.url, "/admin/config", ADMIN, lambda doc: doc["generation"] == 2)

`each_worker` sends requests on new connections (the kernel spreads them over the workers) until
every worker, named by the admin API's `x-kvgate-worker`, has answered in a way `want` accepts. When
the block ends the supervisor and every worker ever seen are killed, so a failed test leaves no
process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.serve_process import KvgateProcess


def children(pid: int) -> list[int]:
    """The pids of a process's children (Linux /proc)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def worker_dir(pid: int) -> Path:
    """The workers' private directory, from a worker's environment."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"KVGATE_WORKER_DIR="):
            return Path(item.split(b"=", 1)[1].decode())
    raise LookupError(f"process {pid} is not a kvgate worker")


class Workers:
    def __init__(self, proc: KvgateProcess) -> None:
        self.proc = proc
        self.url = proc.url
        self.seen: set[int] = set()  # every worker pid seen, for the clean-up

    def workers(self) -> list[int]:
        pids = children(self.proc.proc.pid)
        self.seen.update(pids)
        return pids

    async def wait_workers(
        self, count: int, timeout: float = 30.0, other_than: frozenset[int] = frozenset()
    ) -> list[int]:
        """Wait until the supervisor has `count` children, none of them in `other_than`."""
        async with asyncio.timeout(timeout):
            while True:
                pids = self.workers()
                if len(pids) == count and not set(pids) & other_than:
                    return pids
                await asyncio.sleep(0.05)

    async def kill(self) -> None:
        dirs = set()
        for pid in self.workers():
            with contextlib.suppress(OSError, LookupError):
                dirs.add(worker_dir(pid))
        await self.proc.kill()
        for pid in self.seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for d in dirs:  # a killed supervisor leaves it (one that exits removes it)
            shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def kvgate_workers(
    tmp_path: Path, config: Mapping[str, Any], workers: int = 2
) -> AsyncIterator[Workers]:
    proc = await KvgateProcess.start(tmp_path, config, args=["--workers", str(workers)])
    kv = Workers(proc)
    try:
        pids = await kv.wait_workers(workers)
        async with asyncio.timeout(30):  # each worker's channel: its Gateway has started
            while not all((worker_dir(pids[0]) / f"w{i}.sock").exists() for i in range(workers)):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        yield kv
    finally:
        await kv.kill()


async def each_worker(
    url: str,
    path: str,
    headers: Mapping[str, str],
    want: Callable[[Any], bool],
    workers: int = 2,
    timeout: float = 20.0,
) -> dict[int, Any]:
    """GET `path` on new connections until every worker's answer satisfies `want`; each worker's
    last JSON answer. Fails (TimeoutError, with the answers so far) if one never does."""
    last: dict[int, Any] = {}
    good: set[int] = set()
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection per request
    async with httpx.AsyncClient(base_url=url, timeout=5, limits=limits) as c:
        try:
            async with asyncio.timeout(timeout):
                while len(good) < workers:
                    r = await c.get(path, headers=dict(headers))
                    index = int(r.headers["x-kvgate-worker"])
                    last[index] = r.json()
                    if want(last[index]):
                        good.add(index)
                    else:
                        good.discard(index)
        except TimeoutError:
            raise TimeoutError(f"not every worker answered as wanted: {last}") from None
    return last
