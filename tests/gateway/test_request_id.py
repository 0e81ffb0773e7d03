"""Request ids: a sane client id is kept, anything else replaced by a new, unique one."""

from __future__ import annotations

import pytest

from gateway.request_id import RequestIds


@pytest.mark.parametrize(
    "given",
    [b"abc", b"0af7651916cd43dd8448eb211c80319c", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     b"req:1/2+3=4.5_6-7", b"x" * 128],
)  # fmt: skip
def test_a_sane_client_id_is_kept(given: bytes) -> None:
    assert RequestIds("p").accept_or_new(given) == given


@pytest.mark.parametrize(
    "given", [None, b"", b"x" * 129, b"has space", b"line\r\nbreak", b'quote"', b"\xff\xfe", b"semi;colon"]
)
def test_anything_else_gets_a_new_id(given: bytes | None) -> None:
    ids = RequestIds("p")
    new = ids.accept_or_new(given)
    assert new != given and new.startswith(b"p-")


def test_new_ids_are_unique_within_a_process_and_prefixed_per_process() -> None:
    a, b = RequestIds(), RequestIds()
    ours = {a.accept_or_new(None) for _ in range(1000)}
    assert len(ours) == 1000
    assert ours.isdisjoint({b.accept_or_new(None) for _ in range(1000)})
