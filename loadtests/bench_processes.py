"""The benchmark's child processes: the simulated fleet (`kvgate sim`) and one gateway (`kvgate serve`).

Both run as children of the bench process, each started with `python -m gateway.cli ...` in a new
session (a terminal's Ctrl-C reaches only the bench, which stops them in order) and, on Linux, with a
parent-death signal (SIGTERM), so that even a bench killed with SIGKILL leaves no orphan. `stop()`
sends SIGTERM, waits, then SIGKILLs; it is idempotent, and the context managers always call it.

Where they run is a `ProcessLayout`: on this 2-core machine the simulator gets a core of its own (it
plays the GPUs: its own CPU lag would distort the step times it reports), and the gateway shares the
other core with the load generator (the bench process). Both of those are measured per run (the
generator's CPU by `loadtests.runner`, the gateway's and the simulator's from `/proc`), so the sharing
is noticed, not hidden. `choose_layout` decides; `meta["process_layout"]` records it.

Stdout of `kvgate sim` is read for its replica URLs; every child's stderr goes to a log file.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp
import yaml

from loadtests.ports import free_port

_PR_SET_PDEATHSIG = 1
_CLOCK_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class ProcessLayout:
    """Which CPUs each process may use (None: not pinned). `note` says why, for the report."""

    sim_cpus: tuple[int, ...] | None
    gateway_cpus: tuple[int, ...] | None
    loadgen_cpus: tuple[int, ...] | None
    note: str

    @property
    def pinned(self) -> bool:
        return self.sim_cpus is not None

    def as_meta(self) -> dict[str, Any]:
        def cpus(v: tuple[int, ...] | None) -> list[int] | None:
            return list(v) if v is not None else None

        return {
            "pinned": self.pinned,
            "simulator_cpus": cpus(self.sim_cpus),
            "gateway_cpus": cpus(self.gateway_cpus),
            "loadgen_cpus": cpus(self.loadgen_cpus),
            "note": self.note,
        }


def choose_layout(available: Sequence[int], *, pin: bool = True) -> ProcessLayout:
    """The process layout for the CPUs this process may use.

    - 3 or more: the simulator, the gateway and the load generator one CPU each (the first three).
    - 2: the simulator alone on the second; the gateway and the load generator share the first.
    - 1, `pin` False, or no `taskset`: nothing pinned; the report says so.
    """
    cpus = sorted(available)
    if not pin:
        return ProcessLayout(None, None, None, "not pinned (--no-pin): processes share every CPU")
    if len(cpus) < 2 or shutil.which("taskset") is None:
        why = "one CPU" if len(cpus) < 2 else "no taskset"
        return ProcessLayout(None, None, None, f"not pinned ({why}): processes share every CPU")
    if len(cpus) >= 3:
        return ProcessLayout(
            (cpus[2],), (cpus[1],), (cpus[0],), "one CPU each: simulator, gateway, load generator"
        )
    return ProcessLayout(
        (cpus[1],),
        (cpus[0],),
        (cpus[0],),
        "2 CPUs: the simulator (the GPUs) alone on one, so its own CPU does not stretch its step "
        "times; the gateway and the load generator share the other, and both are measured per run "
        "(gateway_cpu_frac, loadgen_cpu_frac)",
    )


def pin_self(cpus: tuple[int, ...] | None) -> None:
    """Pin this process (the load generator) to `cpus`; no-op for None or where unsupported."""
    if cpus is not None:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, set(cpus))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc; 0.0 where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICK


def rss_bytes(pid: int) -> int:
    """Resident memory of a live process in bytes (from /proc; 0 where unavailable)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGTERM it when the bench dies.
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def kvgate_command(cpus: tuple[int, ...] | None, *args: str) -> list[str]:
    """`[taskset -c CPUS] python -m gateway.cli ARGS...`."""
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus is not None else []
    return [*pin, sys.executable, "-m", "gateway.cli", *args]


class Child:
    """One child process; stdout piped (`read_stdout`, for its ready line), written to `stdout_path`,
    or discarded (one of the three); stderr to `log_path`."""

    def __init__(
        self, cmd: list[str], log_path: Path, *, read_stdout: bool, stdout_path: Path | None = None
    ) -> None:
        if read_stdout and stdout_path is not None:
            raise ValueError("stdout is either piped (read_stdout) or written to stdout_path, not both")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cmd = cmd
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        self._out: IO[bytes] | None = None
        out: int | IO[bytes] = subprocess.PIPE if read_stdout else subprocess.DEVNULL
        if stdout_path is not None:
            out = self._out = stdout_path.open("ab")
        preexec: Callable[[], None] | None = _die_with_parent if sys.platform == "linux" else None
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=self._log,
            start_new_session=True,
            # preexec_fn is unsafe with threads; children are spawned from the main thread.
            preexec_fn=preexec,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; the exit code. Safe to call twice."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(5.0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        if self._out is not None:
            self._out.close()
        return self.proc.returncode


class SimFleetProcess:
    """`kvgate sim SIM_ARGS` as a child (`--port 0` in them); `urls` (one per replica) once started.
    With `--kv-events-port` in SIM_ARGS, `kv_events` holds each replica's (PUB, replay ROUTER)
    endpoints, from the lines `kvgate sim` prints after the URLs. Use as a context manager."""

    def __init__(
        self, sim_args: Sequence[str], replicas: int, cpus: tuple[int, ...] | None, log_path: Path
    ) -> None:
        self.replicas = replicas
        self._cmd = kvgate_command(cpus, *sim_args)
        self._log_path = log_path
        self._want_events = "--kv-events-port" in sim_args
        self.child: Child | None = None
        self.urls: list[str] = []
        self.kv_events: list[tuple[str, str]] = []

    def start(self, timeout_s: float = 60.0) -> list[str]:
        """Start the child and read one URL per replica from its stdout (RuntimeError on failure)."""
        self.child = child = Child(self._cmd, self._log_path, read_stdout=True)
        assert child.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        os.set_blocking(child.proc.stdout.fileno(), False)
        buffer = b""
        while len(self.urls) < self.replicas or (self._want_events and len(self.kv_events) < self.replicas):
            if time.monotonic() > deadline or not child.alive():
                child.stop()
                raise RuntimeError(
                    f"kvgate sim did not start ({'timeout' if child.alive() else 'exited'}); "
                    f"log {self._log_path}:\n{child.log_tail()}"
                )
            chunk = child.proc.stdout.read()
            if chunk:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                self.urls += [ln.decode().strip() for ln in lines if ln.startswith(b"http")]
                self.kv_events += [_kv_endpoints(ln.decode()) for ln in lines if ln.startswith(b"kv-events ")]
            else:
                time.sleep(0.05)
        return self.urls

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

    def __enter__(self) -> SimFleetProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kv_endpoints(line: str) -> tuple[str, str]:
    """`kv-events pub=tcp://H:P replay=tcp://H:Q` (a `kvgate sim` line) -> (pub, replay)."""
    fields = dict(part.split("=", 1) for part in line.split()[1:])
    return fields["pub"], fields["replay"]


def listeners(port: int) -> int:
    """How many sockets listen on TCP `port` (IPv4, from /proc/net/tcp; 0 where unavailable): N
    for a `kvgate serve --workers N` whose workers are all serving (each binds with SO_REUSEPORT)."""
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return 0
    want = f":{port:04X}"
    return sum(1 for r in rows if (f := r.split()) and f[1].endswith(want) and f[3] == "0A")


def tree_cpu_seconds(pid: int) -> float:
    """`cpu_seconds` of a process and of its live children (a supervisor's workers)."""
    try:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        kids = []
    return sum(cpu_seconds(p) for p in (pid, *kids))


class GatewayProcess:
    """`kvgate serve --config FILE` as a child, listening on `url`. Use as an async context manager:
    entering waits until `/ready` answers 200 with every replica scraped. With `workers` it runs
    `kvgate serve --workers N` (the config must share its limits through Redis when N > 1), and
    entering also waits until N sockets listen on the port (every worker serving). `access_log`:
    a file for its stdout (the access log; discarded without it)."""

    def __init__(
        self, config: dict[str, Any], config_path: Path, cpus: tuple[int, ...] | None, log_path: Path,
        *, workers: int | None = None, access_log: Path | None = None,
    ) -> None:  # fmt: skip
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        server = config.get("server", {})
        self._host = server.get("host", "127.0.0.1")
        self._port = int(server.get("port", 0)) or free_port(self._host)
        self.url = f"http://{self._host}:{self._port}"
        self._cmd = kvgate_command(cpus, "serve", "--config", str(config_path), "--port", str(self._port))
        if workers is not None:
            self._cmd += ["--workers", str(workers)]
        self._listeners = workers or 1
        self._log_path = log_path
        self.access_log = access_log
        self._replicas = len(config.get("replicas", ()))
        self.child: Child | None = None

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    async def start(self, timeout_s: float = 60.0) -> None:
        self.child = child = Child(self._cmd, self._log_path, read_stdout=False, stdout_path=self.access_log)
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            while True:
                if not child.alive():
                    raise RuntimeError(f"kvgate serve exited; log {self._log_path}:\n{child.log_tail()}")
                if time.monotonic() > deadline:
                    child.stop()
                    raise RuntimeError(f"kvgate serve not ready in {timeout_s:g}s:\n{child.log_tail()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(self.url + "/ready") as resp:
                        body = await resp.json(content_type=None)
                        seen = [r for r in body.get("replicas", []) if r.get("scraped") and r.get("healthy")]
                        if (resp.status == 200 and len(seen) >= self._replicas
                                and listeners(self._port) >= self._listeners):  # fmt: skip
                            return
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

    async def __aenter__(self) -> GatewayProcess:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
