"""A private `redis-server` for tests: a free loopback port, no persistence, stopped at the end.

    def test_x(redis_server: RedisServer) -> None:
        redis_server.url            # "redis://127.0.0.1:PORT/0"
        redis_server.stop()         # hard kill: connections drop, the port refuses
        redis_server.start()        # the same port again, empty
        redis_server.freeze()       # SIGSTOP: connections hang (timeouts), thaw() resumes

The binary must be on PATH (CI installs it); these tests are never skipped.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH; install Redis to run these tests")
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


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh private Redis per test (import this fixture into the test module)."""
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


__all__ = ["RedisServer", "free_port", "redis_server"]
