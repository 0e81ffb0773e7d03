"""The `redis_server` fixture: a fresh private Redis per test (import it into the test module).

    def test_x(redis_server: RedisServer) -> None:
        redis_server.url            # "redis://127.0.0.1:PORT/0"
        redis_server.stop()         # hard kill: connections drop, the port refuses
        redis_server.start()        # the same port again, empty
        redis_server.freeze()       # SIGSTOP: connections hang (timeouts), thaw() resumes

Without `redis-server` on PATH these tests are skipped (tests/conftest.py), except under CI.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadtests.ports import free_port
from loadtests.redis_process import RedisServer


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
