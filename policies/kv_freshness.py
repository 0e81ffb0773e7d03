"""Whether a replica's KV events are still coming: judged against the traffic sent to it.

vLLM publishes nothing while its cache does not change, so silence alone says nothing: an idle
replica is silent and its picture is still right. What is suspicious is silence while the replica
works: every request it prefills stores blocks (and so does every `block_size` tokens it generates),
unless the whole prompt was already cached and the answer is shorter than a block. So the events are
stale when a request was dispatched to the replica more than `stale_after_s` ago and nothing has been
heard from it since. Any batch heard (live or replayed) makes them fresh again.

Pure logic; the caller passes its monotonic clock readings.
"""

from __future__ import annotations


class EventFreshness:
    __slots__ = ("_waiting_since", "last_heard", "stale_after_s")

    def __init__(self, stale_after_s: float) -> None:
        if stale_after_s <= 0:
            raise ValueError(f"stale_after_s must be positive, got {stale_after_s}")
        self.stale_after_s = stale_after_s
        self.last_heard: float | None = None
        self._waiting_since: float | None = None  # first dispatch since the last batch heard

    def heard(self, now: float) -> None:
        self.last_heard = now
        self._waiting_since = None

    def dispatched(self, now: float) -> None:
        if self._waiting_since is None:
            self._waiting_since = now

    def stale(self, now: float) -> bool:
        since = self._waiting_since
        return since is not None and now - since > self.stale_after_s
