"""Every upstream client test runs on asyncio's own loop and on uvloop (what uvicorn serves kvgate
on when it is installed): the two differ in transport details the client depends on (a new TLS
connection on uvloop still holds the end of its handshake in the write buffer, for one)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

try:
    import uvloop
except ImportError:  # not installed on Windows: asyncio's loop only
    uvloop = None  # type: ignore[assignment]


@pytest.hookimpl(optionalhook=True)  # pytest-asyncio's hook: without the test extras, not an error
def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories
