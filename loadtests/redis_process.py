"""A private `redis-server` process: a free loopback port, no persistence, killed at the end.

For the tests (the `redis_server` fixture in tests/gateway/redis_server.py) and the benchmarks that
need a Redis they may kill and restart (loadtests.chaos_soak):

    with RedisServer() as redis:
        redis.url                   # "redis://127.0.0.1:PORT/0"
        redis.stop()                # hard kill: connections drop, the port refuses
        redis.start()               # the same port again, empty
        redis.freeze()              # SIGSTOP: connections hang (timeouts), thaw() resumes

The `redis-server` binary must be on PATH.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time

from loadtests.ports import free_port

START_TIMEOUT_S = 10.0


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH; install the redis-server package")
        self._binary = binary
        self.port = port or free_port()
        self._dir = tempfile.mkdtemp(prefix="kvgate-redis-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._frozen = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        self._proc = subprocess.Popen(
            [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}")
            if self.ping():
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("redis-server did not answer PING in time")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Kill it (as a crash would): open connections break, new ones are refused."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._frozen:
            proc.send_signal(signal.SIGCONT)
            self._frozen = False
        proc.kill()
        proc.wait(timeout=10)

    def freeze(self) -> None:
        """Stop answering without closing anything: calls hang until their timeout."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._frozen = True

    def thaw(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)
        self._frozen = False

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["RedisServer", "free_port"]
