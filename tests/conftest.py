"""Suite-wide rules: tests that need a real Redis run against a private `redis-server` from PATH.

On a machine without one, the README's test command still passes: those tests are skipped and the
summary says so in one line, naming the package to install. Under CI (`CI=true`, which `.ci/run`
sets) a missing `redis-server` is an error instead: CI must prove the Redis store, not skip it.
"""

from __future__ import annotations

import os
import shutil

import pytest

REDIS_FIXTURE = "redis_server"
_INSTALL_HINT = (
    "install the redis-server package (Debian/Ubuntu: apt install redis-server; macOS: brew install redis)"
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shutil.which("redis-server") is not None:
        return
    needing = [it for it in items if REDIS_FIXTURE in getattr(it, "fixturenames", ())]
    if not needing:
        return
    if _in_ci():
        raise pytest.UsageError(
            f"CI=true but redis-server is not on PATH: {len(needing)} tests need it; {_INSTALL_HINT}"
        )
    skip = pytest.mark.skip(reason=f"redis-server is not on PATH; {_INSTALL_HINT}")
    for it in needing:
        it.add_marker(skip)
    config.stash[_SKIPPED] = len(needing)


_SKIPPED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    n = config.stash.get(_SKIPPED, 0)
    if n:
        terminalreporter.write_line(
            f"{n} Redis tests skipped: redis-server is not on PATH; {_INSTALL_HINT}", yellow=True
        )
