"""The suite's own pre-collection check (tests/conftest.py): what it reports as missing."""

from __future__ import annotations

from tests.conftest import REQUIRED_MODULES, missing_modules


def test_installed_modules_are_not_reported_missing() -> None:
    assert missing_modules() == []
    assert "prometheus_client" in REQUIRED_MODULES


def test_a_module_that_is_not_installed_is_named() -> None:
    assert missing_modules(("json", "kvgate_no_such_module")) == ["kvgate_no_such_module"]
