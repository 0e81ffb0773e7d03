"""`kvgate serve --workers N` (N > 1): a supervising parent and N worker processes on one port.

Each worker is `kvgate serve` itself (the same command, arguments and config file), started with
its slot in the environment (gateway/worker_group.py). Each binds the port with SO_REUSEPORT, so the
kernel (Linux) spreads new connections across the workers' listeners; a connection stays with the
worker that accepted it. A worker listens only once its Gateway has started (the first scrapes
done), so no connection waits on a worker that cannot serve yet.

The parent serves nothing and owns the signals. Workers run in process groups of their own, so a
terminal's Ctrl-C reaches only the parent, which passes each signal on once (they stay in its
session: a session of their own would also be a scheduler autogroup of their own on kernels that
group by session, giving N workers N shares of a busy machine's CPU):

- SIGTERM or SIGINT: SIGTERM to every worker, which drains as a single kvgate does
  (gateway/drain.py); again: passed again (each worker exits at once). The parent exits when every
  worker has: 0 when all exited 0 (or died of that SIGTERM while still starting, having served
  nothing), else the first failing status (143 after a second signal).
- SIGHUP: passed to every worker: each reloads the config file (gateway/reload.py). A worker ignores
  SIGHUP until its server handles it (it reads the file as it starts anyway).
- a worker that exits when it was not asked to (a crash, an OOM kill, a `kill` of its pid) is
  started again after a backoff (RESTART_MIN_S doubling per recent exit up to RESTART_MAX_S). Past
  MAX_EXITS unexpected exits within EXIT_WINDOW_S the parent gives up: it drains the other workers
  and exits 1, so the platform (systemd, the kubelet) sees a crash loop instead of a half-dead pod.

Before starting the workers the parent checks that nothing listens on the port yet: with
SO_REUSEPORT a second kvgate of the same user would otherwise share the port silently. Each
worker asks the kernel for SIGTERM when the parent dies (even by SIGKILL): none outlives it.
The parent does not probe its workers' health: a worker that hangs is not restarted.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from gateway.config import Config
from gateway.logs import configure as configure_logging
from gateway.worker_group import WorkerSlot

log = logging.getLogger(__name__)

RESTART_MIN_S = 0.25
RESTART_MAX_S = 5.0
MAX_EXITS = 5  # unexpected worker exits within EXIT_WINDOW_S before the parent gives up
EXIT_WINDOW_S = 60.0
POLL_S = 0.05


class PortInUse(Exception):
    pass


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUse if something listens on host:port (bound without SO_REUSEPORT, the probe
    fails when any socket holds the port, a kvgate's workers included)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise PortInUse(f"{host}:{port} is already in use") from None
            raise


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None  # monotonic time of its next start, while it is down
    exit_code: int | None = None  # the status it exited with once the parent is stopping


@dataclass
class Supervisor:
    """Runs the workers until they have all exited (module doc); `run()` returns the exit status."""

    argv: Sequence[str]  # the worker command, e.g. [python, -m, gateway.cli, serve, --config, ...]
    count: int
    workers: list[_Worker] = field(default_factory=list)
    _signals: list[int] = field(default_factory=list)
    _exits: list[float] = field(default_factory=list)  # monotonic times of unexpected exits
    _stopping: int = 0  # stop signals passed on
    _gave_up: bool = False

    def run(self) -> int:
        wdir = Path(tempfile.mkdtemp(prefix="kvgate-workers-"))  # mode 0700
        self._slot = WorkerSlot(0, self.count, wdir, os.getpid())
        caught = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {s: signal.signal(s, self._on_signal) for s in caught}
        try:
            self.workers = [_Worker(i) for i in range(self.count)]
            for w in self.workers:
                self._start(w)
            log.info("kvgate: %d workers started (pids %s)", self.count, self.pids())
            while self._step():
                time.sleep(POLL_S)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._kill_all()
            shutil.rmtree(wdir, ignore_errors=True)
        if self._gave_up:
            return 1
        return next((w.exit_code for w in self.workers if w.exit_code), 0)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc is not None]

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _start(self, w: _Worker) -> None:
        env = {**os.environ, **WorkerSlot(w.index, self.count, self._slot.dir, os.getpid()).env()}
        # SIGHUP ignored until the worker handles it (its server installs the handler): a reload
        # passed on while it starts would otherwise kill it. An ignored signal survives exec.
        w.proc = subprocess.Popen(list(self.argv), env=env, process_group=0, preexec_fn=_ignore_sighup)
        w.restart_at = None

    def _send(self, signum: int) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signum)

    def _step(self) -> bool:
        """One turn of the loop: signals, exits, restarts. False once every worker has exited."""
        while self._signals:
            signum = self._signals.pop(0)
            if signum == signal.SIGHUP:
                if not self._stopping:
                    log.info("SIGHUP: reloading every worker")
                    self._send(signal.SIGHUP)
            else:
                self._stop(signum)
        now = time.monotonic()
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is not None:
                self._exited(w, w.proc.returncode, now)
            elif w.proc is None and w.restart_at is not None and now >= w.restart_at and not self._stopping:
                log.warning("kvgate: starting worker %d again", w.index)
                self._start(w)
        return any(w.proc is not None for w in self.workers)

    def _stop(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self._stopping += 1
        log.warning("%s: passed to every worker%s", name, " again" if self._stopping > 1 else "")
        for w in self.workers:
            w.restart_at = None
        # SIGINT goes on as SIGTERM: the same drain, and a worker still starting up dies of it
        # quietly (SIGINT would end it with a KeyboardInterrupt traceback and status 1).
        self._send(signal.SIGTERM)

    def _exited(self, w: _Worker, code: int, now: float) -> None:
        assert w.proc is not None
        pid, w.proc = w.proc.pid, None
        snapshot = self._slot.snapshot(w.index)
        if snapshot.exists():  # its counters keep counting in /metrics (gateway/worker_metrics.py)
            os.replace(snapshot, self._slot.dir / f"exited-{pid}.json")
        if self._stopping:
            # Killed by the very signal passed on, before it could handle it (still starting up):
            # it served nothing, so that is a clean exit too.
            w.exit_code = 0 if code == -signal.SIGTERM else 128 - code if code < 0 else code
            return
        self._exits = [t for t in self._exits if now - t < EXIT_WINDOW_S] + [now]
        recent = len(self._exits)
        if recent > MAX_EXITS:
            log.error(
                "kvgate: worker %d (pid %d) exited with status %d: %d unexpected exits in %gs, giving up",
                w.index, pid, code, recent, EXIT_WINDOW_S,
            )  # fmt: skip
            self._gave_up = True
            self._stop(signal.SIGTERM)
            return
        delay = min(RESTART_MAX_S, RESTART_MIN_S * 2 ** (recent - 1))
        log.error(
            "kvgate: worker %d (pid %d) exited unexpectedly with status %d; starting it again in %.2gs",
            w.index, pid, code, delay,
        )  # fmt: skip
        w.restart_at = now + delay

    def _kill_all(self) -> None:
        """Only on the way out after an error in the parent itself: no worker outlives it."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def worker_argv(config_path: str, host: str, port: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", "serve", "--config", config_path,
            "--host", host, "--port", str(port), "--workers", str(workers)]  # fmt: skip


def supervise(config: Config, config_path: str, host: str, port: int) -> int:
    """Run `server.workers` kvgate processes on host:port until they are stopped; the exit status."""
    configure_logging(config.server)
    workers = config.server.workers
    try:
        check_port_free(host, port)
    except PortInUse as err:
        print(f"kvgate serve: {err}", file=sys.stderr)
        return 2
    return Supervisor(worker_argv(config_path, host, port, workers), workers).run()
