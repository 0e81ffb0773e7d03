"""Stop strings cut the output just before the first one found, even across token boundaries."""

from __future__ import annotations

import pytest

from simulator.server.stops import StopMatcher


@pytest.mark.parametrize(
    ("stops", "pieces", "stopped_at", "text", "matched"),
    [
        ((" and",), [" the", " of", " and", " to"], 2, " the of", " and"),
        (("of a",), [" the", " of", " a"], 2, " the ", "of a"),  # spans tokens
        (("zzz",), [" the", " of"], None, " the of", None),
        ((" of", " the"), [" the", " of"], 0, "", " the"),  # the earliest position wins
        (("e o",), [" the", " of"], 1, " th", "e o"),
    ],
)
def test_first_stop_string_wins(stops: tuple[str, ...], pieces: list[str], stopped_at: int | None, text: str,
                                matched: str | None) -> None:
    matcher = StopMatcher(stops)
    hits = [matcher.feed(p) for p in pieces]
    assert (hits.index(True) if True in hits else None) == stopped_at
    assert (matcher.text, matcher.matched) == (text, matched)


def test_safe_len_holds_back_a_possible_stop_prefix() -> None:
    matcher = StopMatcher(["abc"])
    matcher.feed("xxab")
    assert matcher.text[: matcher.safe_len] == "xx"
    matcher.feed("cd")
    assert (matcher.text, matcher.safe_len) == ("xx", 2)


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError):
        StopMatcher([""])
