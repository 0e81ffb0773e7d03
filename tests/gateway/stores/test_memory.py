"""The memory store: what the contract tests cannot see — it never yields to the event loop."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest

from gateway.stores.memory import MemoryBucketStore
from tests.gateway.stores.fakes import FakeClock, bucket

TOK = bucket("acme", "tokens", 100, 1.0)


def run_without_yielding(coro: Coroutine[Any, Any, Any]) -> Any:
    """The coroutine's result if it finishes on its first step, i.e. without suspending."""
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    return done.value.value


def test_take_settle_and_peek_complete_without_suspending() -> None:
    store = MemoryBucketStore(FakeClock())
    t = run_without_yielding(store.take([TOK], [30]))
    assert t.allowed and t.levels == (70.0,) and t.source == "memory"
    levels = run_without_yielding(store.settle([TOK], [30], [10], t.source))
    assert levels.levels[0].level == 90.0
    (lv,), source = run_without_yielding(store.peek([TOK]))
    assert lv.level == 90.0 and source == "memory"


def test_fallback_store_names_itself_in_its_takes() -> None:
    store = MemoryBucketStore(FakeClock(), source="local")
    assert store.take_now([TOK], [1]).source == "local"
