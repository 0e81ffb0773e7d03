"""Stop strings, as vLLM applies them: the output ends just before the first stop string it contains."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Accumulates one request's output text and finds the first stop string in it.

    `feed(piece)` is called per output token; once it returns True, `text` is the output truncated before
    the stop string and `matched` is that string (vLLM's `stop_reason`). While streaming, only
    `text[:safe_len]` may be sent: the tail could still turn out to begin a stop string.
    """

    __slots__ = ("_hold", "matched", "stops", "text")

    def __init__(self, stops: Sequence[str]) -> None:
        if not stops or not all(stops):
            raise ValueError("StopMatcher needs non-empty stop strings")
        self.stops = tuple(stops)
        self._hold = max(map(len, self.stops)) - 1
        self.text = ""
        self.matched: str | None = None

    def feed(self, piece: str) -> bool:
        if self.matched is not None:
            return True
        start = max(0, len(self.text) - self._hold)
        self.text += piece
        hit: tuple[int, str] | None = None
        for stop in self.stops:
            at = self.text.find(stop, start)
            if at != -1 and (hit is None or at < hit[0]):
                hit = (at, stop)
        if hit is None:
            return False
        self.text = self.text[: hit[0]]
        self.matched = hit[1]
        return True

    @property
    def safe_len(self) -> int:
        """How much of `text` can be streamed now without risking text that a stop string will cut."""
        if self.matched is not None:
            return len(self.text)
        return max(0, len(self.text) - self._hold)
