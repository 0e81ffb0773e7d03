"""Suite-wide rules: tests that need a program from the machine (a real Redis, a real Prometheus) find
it on PATH, and say so by asking for a fixture named below.

On a machine without one, the README's test command still passes: those tests are skipped and the
summary says so in one line per program, naming the package to install. Under CI (`CI=true`, which
`.ci/run` sets, and `.ci/run` installs them) a missing program is an error instead: CI must prove the
Redis store and the monitoring files, not skip them.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import NamedTuple

import pytest


class Needs(NamedTuple):
    what: str  # names the tests in the summary line
    executables: tuple[str, ...]
    hint: str


# fixture name -> the programs its tests need
NEEDS: dict[str, Needs] = {
    "redis_server": Needs(
        "Redis",
        ("redis-server",),
        "install the redis-server package "
        "(Debian/Ubuntu: apt install redis-server; macOS: brew install redis)",
    ),
    "prometheus_package": Needs(
        "Prometheus",
        ("prometheus", "promtool"),
        "install the prometheus package, which brings promtool too "
        "(Debian/Ubuntu: apt install prometheus; macOS: brew install prometheus)",
    ),
}


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(needs: Needs) -> list[str]:
    return [exe for exe in needs.executables if shutil.which(exe) is None]


# What the README's `pip install -e '.[test]'` brings, checked before collection: a pytest run outside
# that environment (a global pytest, a venv without the extras) otherwise fails to import ~150 test
# modules one by one instead of saying once what to install.
REQUIRED_MODULES = ("fastapi", "httpx", "redis", "xxhash", "prometheus_client", "hypothesis")


def missing_modules(names: tuple[str, ...] = REQUIRED_MODULES) -> list[str]:
    """The names in `names` this interpreter cannot import (found without importing them)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Two test workers unless `-n` says otherwise (most of the suite waits on real servers and child
    processes: ~4.5 minutes on 2 cores instead of ~8). Set here rather than in addopts, so that a pytest
    without pytest-xdist (the test extras not installed) still runs the suite in one process instead of
    refusing its own options. Then: under CI every program must be there, checked once, before any test
    (or test worker) starts."""
    missing = missing_modules()
    if missing:
        pytest.exit(
            f"kvgate's test dependencies are not installed in this Python ({', '.join(missing)} missing): "
            "run `pip install -e '.[test]'` from the repository root, then `pytest`",
            returncode=4,
        )
    if (
        config.pluginmanager.hasplugin("xdist")
        and getattr(config.option, "numprocesses", 0) is None
        and not hasattr(config, "workerinput")
    ):
        config.option.numprocesses = 2
        config.option.dist = "loadfile"
        config.option.tx = ["popen"] * 2  # what xdist's own -n handling (already run) would have set
    if not _in_ci() or hasattr(config, "workerinput"):  # workerinput: a pytest-xdist worker
        return
    for needs in NEEDS.values():
        missing = _missing(needs)
        if missing:
            raise pytest.UsageError(
                f"CI=true but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH: "
                f"the {needs.what} tests need it; {needs.hint}"
            )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for fixture, needs in NEEDS.items():
        missing = _missing(needs)
        if not missing:
            continue
        needing = [it for it in items if fixture in getattr(it, "fixturenames", ())]
        if not needing:
            continue
        absent = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH"
        skip = pytest.mark.skip(reason=f"{absent}; {needs.hint}")
        for it in needing:
            it.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """One line per missing program, counted from the skipped reports themselves: with test workers
    (pytest-xdist) the skips are decided in the workers, and only their reports reach this process."""
    counts: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        for needs in NEEDS.values():
            if needs.hint in reason:
                line = f"{needs.what} tests skipped: {reason.removeprefix('Skipped: ')}"
                counts[line] = counts.get(line, 0) + 1
    for line, n in counts.items():
        terminalreporter.write_line(f"{n} {line}", yellow=True)


@pytest.fixture(scope="session")
def prometheus_package() -> dict[str, str]:
    """Paths of `prometheus` and `promtool` (Debian's prometheus package has both)."""
    paths = {exe: shutil.which(exe) for exe in NEEDS["prometheus_package"].executables}
    return {exe: path for exe, path in paths.items() if path is not None}
