"""`kvgate serve` as a real process for tests about the process itself: signals, drain, exit status.

    async with kvgate_serve(tmp_path, config) as proc:  # writes the config, waits until /health answers
        await proc.wait_ready()                          # /ready 200: every replica scraped
        proc.signal(signal.SIGTERM)
        code = await proc.wait(timeout=30)               # the exit status
        proc.output()                                    # what it wrote on stdout and stderr

The replicas may be a `SimFleet` in the test's own event loop: the process only needs their URLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from loadtests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class KvgateProcess:
    proc: asyncio.subprocess.Process
    url: str
    config_path: Path
    log_path: Path
    _log: IO[bytes]

    @classmethod
    async def start(
        cls, tmp_path: Path, config: Mapping[str, Any], timeout: float = 30.0, args: Sequence[str] = ()
    ) -> KvgateProcess:
        port = free_port()
        config_path = tmp_path / "kvgate.yaml"
        cfg = dict(config)
        cfg["server"] = {**cfg.get("server", {}), "port": port}
        config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        log_path = tmp_path / "kvgate.log"
        log = log_path.open("wb")
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path), *args],
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        p = cls(proc, f"http://127.0.0.1:{port}", config_path, log_path, log)
        try:
            await p._wait_for("/health", timeout)
        except BaseException:
            await p.kill()
            raise
        return p

    async def _wait_for(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(base_url=self.url, timeout=1) as c:
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"kvgate exited with {self.proc.returncode}:\n{self.output()}")
                try:
                    if (await c.get(path)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.05)
        raise TimeoutError(f"{path} did not answer 200 within {timeout}s:\n{self.output()}")

    async def wait_ready(self, timeout: float = 30.0) -> None:
        await self._wait_for("/ready", timeout)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    async def wait(self, timeout: float) -> int:
        """The exit status; raises TimeoutError (and kills it) if it has not exited by then."""
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.kill()
            raise TimeoutError(f"kvgate did not exit within {timeout}s:\n{self.output()}") from None

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._log.close()


@contextlib.asynccontextmanager
async def kvgate_serve(tmp_path: Path, config: Mapping[str, Any]) -> AsyncIterator[KvgateProcess]:
    """`kvgate serve` on a free port with `config` (its `server.port` set); killed if still running
    when the block ends, so a failed test leaves no server behind."""
    proc = await KvgateProcess.start(tmp_path, config)
    try:
        yield proc
    finally:
        await proc.kill()
