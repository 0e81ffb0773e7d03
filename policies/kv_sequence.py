"""The order of one replica's KV-event batches: in order, a gap (and its replay), a restarted engine.

vLLM numbers its batches 0, 1, 2, ... per engine process, publishes them on a PUB socket (no
acknowledgement: a slow or reconnecting subscriber just misses some), and keeps the last ones (10,000
by default) for a ROUTER replay socket that answers "everything from sequence n" and then an end
marker. This tracker is told what arrived and says what to do, as a list of steps for the caller:

- `Apply(item)`: apply the batch to the index. A batch with sequence 0 is always preceded by
  `Reset(complete=True)`: the engine has just started and its cache is empty.
- `Reset(complete=False)`: events were lost for good (the replay did not reach back far enough, or
  there is no replay socket): forget the replica's blocks; its index is incomplete until rebuilt
  (`policies.exact_index`).
- `Replay(start)`: ask the replay socket for the batches from `start` on. Live batches that arrive
  meanwhile are held, and applied in order when the replay ends (`replay_ended`).

The rules. Live batches come from a PUB socket, which never repeats one, so a live sequence number
that goes BACK means a new engine process: with 0 it is applied at once (after the reset); with n > 0
the new engine's first batches were missed and are asked for from 0. A live number that jumps ahead
is a gap: asked for from the first missing one. The first batch ever received is treated the same
way: 0 starts a complete picture, n > 0 asks for the engine's history from 0 (complete again if the
replay still holds sequence 0). Replayed batches already applied are skipped; a replay whose first
batch is past the one asked for (the publisher's buffer has moved on), that ends without reaching the
held batches, or that fails (`replay_ended(False)`: a timeout, no answer) loses the missing batches:
`Reset(False)` and carry on from what there is.

A connection that dropped and came back (`reconnected`) may lead to another process on the same
address: a restarted engine whose first batches were missed, now numbering exactly where the old one
stopped, would pass for a continuation. So after a reconnection the tracker asks the replay socket
for the last batch it applied (`expected - 1`) and compares it with the one it kept (`same`): the
same batch means the same engine, and only what was missed meanwhile is applied; another batch (or
none) means another engine, whose picture starts over (with its sequence 0: complete at once): its
history is asked for from 0 at once (what it published while the connection was down would
otherwise be lost, or wait for its next batch to reveal the gap), replacing the replay in flight.

Pure logic: no sockets, no clock. Counters are plain ints the caller reads for metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Apply(Generic[T]):
    item: T


@dataclass(frozen=True, slots=True)
class Reset:
    complete: bool  # True: the engine's cache is known empty; False: events lost, picture incomplete


@dataclass(frozen=True, slots=True)
class Replay:
    start: int


Step = Apply[T] | Reset | Replay


class SequenceTracker(Generic[T]):
    """One replica's stream. `can_replay`: a replay socket is configured. At most `max_held` live
    batches wait for a replay; one more ends the replay as failed. `same(a, b)`: whether two batches
    are the same batch (their payloads), to recognise the engine after a reconnection."""

    def __init__(
        self, can_replay: bool, max_held: int = 10_000, same: Callable[[T, T], bool] | None = None
    ) -> None:
        self.can_replay = can_replay
        self.max_held = max_held
        self._same = same if same is not None else (lambda a, b: a == b)
        self._last: T | None = None  # the last batch applied
        self._zero: T | None = None  # the last batch applied with sequence 0 (an engine's first)
        self._verifying = False  # the replay in flight starts with the last batch applied
        self.expected: int | None = None  # the next sequence to apply; None before the first batch
        self.replay_start: int | None = None  # set while a replay is in flight
        self._held: list[tuple[int, T]] = []
        self._replay_lost = False  # the replay in flight has already skipped missing batches
        # Counters (monotonic)
        self.gaps = 0  # jumps ahead in the live stream
        self.restarts = 0  # sequence went back: a new engine process
        self.replays = 0  # replays asked for
        self.replays_filled = 0  # ... that brought every missing batch
        self.losses = 0  # times batches were lost for good (Reset(False))
        self.skipped = 0  # replayed or held batches already applied
        self.reconnects = 0  # connections that came back (each verified by a replay)

    @property
    def replaying(self) -> bool:
        return self.replay_start is not None

    @property
    def in_order(self) -> bool:
        """Every batch since the first one applied has been applied (no replay pending)."""
        return self.expected is not None and self.replay_start is None

    def live(self, seq: int, item: T) -> list[Step[T]]:
        """A batch from the PUB socket."""
        if self.replay_start is not None:
            self._held.append((seq, item))
            if len(self._held) > self.max_held:
                return self.replay_ended(False)
            return []
        expected = self.expected
        if expected is None or seq < expected:
            if expected is not None:
                self.restarts += 1
            if seq == 0:
                return self._apply(0, item)
            return self._ask(0, seq, item, lost=expected is not None)
        if seq == expected:
            return self._apply(seq, item)
        self.gaps += 1
        return self._ask(expected, seq, item, lost=True)

    def reconnected(self) -> list[Step[T]]:
        """The connection to the publisher dropped and is back: check it is the same engine."""
        self.reconnects += 1
        if not self.can_replay or self.expected is None or self.expected == 0 or self.replaying:
            return []  # nothing to compare with (or a replay in flight will tell)
        self.replays += 1
        self.expected -= 1
        self.replay_start = self.expected
        self._verifying = True
        return [Replay(self.expected)]

    def replayed(self, seq: int, item: T) -> list[Step[T]]:
        """A batch from the replay socket (ignored when no replay is in flight)."""
        if self.replay_start is None or self.expected is None:
            return []
        if self._verifying:
            self._verifying = False
            if seq == self.expected and self._last is not None and self._same(item, self._last):
                self.expected += 1  # the same engine: carry on after the batch we had
                return []
            self.restarts += 1  # another engine on the address (or the batch is gone: cannot tell)
            if seq == 0:
                return self._apply(0, item)
            # Its history is at least as long as the old one's: ask for it whole, from 0 (the caller
            # drops the replay in flight for the new one); the held live batches wait for it.
            self.losses += 1
            self.replays += 1
            self.replay_start = 0
            self.expected = 0
            return [Reset(complete=False), Replay(0)]
        if seq < self.expected:
            self.skipped += 1
            return []
        if seq == self.expected:
            return self._apply(seq, item)
        self._replay_lost = True
        return self._lose_up_to(seq, item)

    def replay_ended(self, ok: bool) -> list[Step[T]]:
        """The end marker came (`ok`), or the replay failed: apply the held batches, in order."""
        if self.replay_start is None:
            return []
        self.replay_start = None
        if self._verifying:  # not even the batch we had came back: another engine; start over
            self._verifying = False
            self._replay_lost = False
            self.restarts += 1
            self.losses += 1
            self.expected = None
            held, self._held = self._held, []
            steps: list[Step[T]] = [Reset(complete=False)]
            if not held:  # its history is shorter than the old one's: ask for it whole now, rather
                return [*steps, *self._ask_history()]  # than wait for the engine's next batch
            for seq, item in held:
                steps += self.live(seq, item)
            return steps
        held, self._held = self._held, []
        steps = []
        filled = ok and not self._replay_lost
        self._replay_lost = False
        for seq, item in held:
            expected = self.expected
            assert expected is not None
            if seq == expected:
                steps += self._apply(seq, item)
            elif seq > expected:
                filled = False
                steps += self._lose_up_to(seq, item)
            elif seq == 0 and not (self._zero is not None and self._same(item, self._zero)):
                self.restarts += 1  # a restart while we waited for the replay
                steps += self._apply(0, item)
            else:
                self.skipped += 1
        if filled:
            self.replays_filled += 1
        return steps

    # -- internals ---------------------------------------------------------------------------------

    def _apply(self, seq: int, item: T) -> list[Step[T]]:
        self.expected = seq + 1
        self._last = item
        if seq == 0:
            self._zero = item
            return [Reset(complete=True), Apply(item)]
        return [Apply(item)]

    def _ask(self, start: int, seq: int, item: T, *, lost: bool) -> list[Step[T]]:
        """Batches `start`..`seq - 1` are missing; `seq` is in hand. `lost`: the picture already
        applied is wrong (a gap, a restart) rather than merely empty (the first batch)."""
        if not self.can_replay:
            steps: list[Step[T]] = [Reset(complete=False)]
            self.losses += 1
            self.expected = seq + 1
            return [*steps, Apply(item)]
        self.replays += 1
        self.replay_start = start
        self.expected = start
        self._held = [(seq, item)]
        steps = []
        if lost and start == 0:  # a new engine: the old one's blocks are gone whatever the replay says
            steps.append(Reset(complete=False))
        steps.append(Replay(start))
        return steps

    def _ask_history(self) -> list[Step[T]]:
        """Ask for the engine's batches from 0, none in hand (after a reconnection to a new engine
        whose history is shorter than the old one's: it may have published while we were away)."""
        self.replays += 1
        self.replay_start = 0
        self.expected = 0
        self._held = []
        return [Replay(0)]

    def _lose_up_to(self, seq: int, item: T) -> list[Step[T]]:
        self.losses += 1
        self.expected = seq + 1
        return [Reset(complete=False), Apply(item)]


def applied(steps: Sequence[Step[T]]) -> list[T]:
    """The items of the `Apply` steps, in order (tests and logging)."""
    return [s.item for s in steps if isinstance(s, Apply)]
