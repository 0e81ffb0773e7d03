"""One replica's KV events, from raw frames to the exact index: decode, order, apply, count.

The subscriber (gateway/kv_events/subscriber.py) hands over frames as they come off its sockets and
does what the feed asks (send a replay request); everything in between is here and does no I/O: the
wire decoder, the sequence tracker (`policies.kv_sequence`), the index (`policies.exact_index`) and
the freshness judge (`policies.kv_freshness`). Only the engine's own GPU blocks of KV-cache group 0
are indexed (the group of an ordinary model; a hybrid model's other groups, and blocks an offloading
connector reports on another medium, are counted and skipped).

The replica is in exact mode (`exact`) when its batches have been applied in order, its index is
complete and its events are not stale.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gateway.kv_events.wire import (
    REPLAY_END,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    WireError,
    decode_message,
    decode_payload,
    decode_seq,
)
from policies.exact_index import ExactIndex, Stored
from policies.kv_freshness import EventFreshness
from policies.kv_sequence import Apply, Replay, Reset, SequenceTracker, Step

log = logging.getLogger(__name__)

_GPU_MEDIA = (None, "GPU", "gpu")


class ReplicaFeed:
    """The event state of one replica (`name`), which `index` must already know (`add_replica`)."""

    def __init__(
        self, name: str, index: ExactIndex, *, can_replay: bool, stale_after_s: float, topic: str = ""
    ) -> None:
        self.name = name
        self.index = index
        self.topic = topic
        self.tracker: SequenceTracker[EventBatch] = SequenceTracker(can_replay, same=_same_batch)
        self.freshness = EventFreshness(stale_after_s)
        # Counters (monotonic), for /metrics.
        self.batches = 0  # batches applied
        self.events = 0  # events in them
        self.invalid = 0  # messages that were not vLLM KV-event messages (skipped)
        self.unkeyable = 0  # blocks stored under a parent the index did not hold
        self.overflows = 0  # resets because the index outgrew the engine's capacity
        self.unknown_removed = 0  # removals of blocks the index did not hold
        self.skipped_events = 0  # other KV-cache groups or media
        self.replays_failed = 0  # replays that timed out or were abandoned

    # -- from the subscriber -----------------------------------------------------------------------

    def on_live(self, frames: Sequence[bytes], now: float) -> int | None:
        """A message from the PUB socket; returns a replay start to ask for, or None."""
        try:
            batch = decode_message(frames)
        except WireError as err:
            self._invalid(err)
            return None
        if self.topic and not batch.topic.startswith(self.topic):
            return None  # another topic (the subscription filters by prefix already)
        return self.on_batch(batch, now)

    def on_batch(self, batch: EventBatch, now: float) -> int | None:
        """A decoded live batch (the discrete-event mode hands them over without sockets); returns a
        replay start to ask for, or None."""
        self.freshness.heard(now)
        return self._run(self.tracker.live(batch.seq, batch))

    def on_replayed(self, frames: Sequence[bytes], now: float) -> int | None:
        """A message from the replay socket: `[b"", seq, payload]`. Returns the start of the next
        replay to ask for, or None. After the end marker `tracker.replaying` is False unless the
        held batches asked for another replay (a new engine's history, from 0), which is returned."""
        try:
            if len(frames) != 3 or frames[0]:
                raise WireError(f"a replay answer is [empty, seq, payload], got {len(frames)} frames")
            seq = decode_seq(bytes(frames[1]))
            if seq == REPLAY_END:
                return self._run(self.tracker.replay_ended(True))
            ts, events, rank = decode_payload(bytes(frames[2]))
        except WireError as err:
            self._invalid(err)
            return None
        self.freshness.heard(now)
        batch = EventBatch(topic="", seq=seq, ts=ts, events=events, dp_rank=rank)
        return self._run(self.tracker.replayed(seq, batch))

    def on_reconnected(self) -> int | None:
        """The SUB's connection dropped and is back (maybe to a restarted engine): returns the replay
        start that checks which (`SequenceTracker.reconnected`), or None."""
        return self._run(self.tracker.reconnected())

    def on_replay_failed(self) -> int | None:
        """The replay did not end in time (or its socket failed): the missing batches are lost.
        Returns the start of a replay the held batches ask for (a new engine's history), or None."""
        if not self.tracker.replaying:
            return None
        self.replays_failed += 1
        return self._run(self.tracker.replay_ended(False))

    # -- for routing -------------------------------------------------------------------------------

    def exact(self, now: float) -> bool:
        return self.tracker.in_order and self.index.complete(self.name) and not self.freshness.stale(now)

    # -- internals ---------------------------------------------------------------------------------

    def _invalid(self, err: WireError) -> None:
        self.invalid += 1
        if self.invalid == 1 or self.invalid % 1000 == 0:
            log.warning("replica %s: KV-event message skipped (%d so far): %s", self.name, self.invalid, err)

    def _run(self, steps: list[Step[EventBatch]]) -> int | None:
        replay = None
        for step in steps:
            if isinstance(step, Apply):
                self._apply(step.item)
            elif isinstance(step, Reset):
                self.index.reset(self.name, complete=step.complete)
                if not step.complete:
                    log.info("replica %s: KV events lost; its exact index starts over", self.name)
            elif isinstance(step, Replay):
                replay = step.start
        return replay

    def _apply(self, batch: EventBatch) -> None:
        self.batches += 1
        self.events += len(batch.events)
        index, name = self.index, self.name
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.group_idx != 0 or event.medium not in _GPU_MEDIA:
                    self.skipped_events += 1
                    continue
                result = index.store(
                    name,
                    event.parent_block_hash,
                    event.block_hashes,
                    event.token_ids,
                    event.block_size,
                    event.lora_name,
                    event.lora_id,
                    event.extra_keys,
                )
                if result is Stored.UNKEYABLE:
                    self.unkeyable += len(event.block_hashes)
                elif result is Stored.OVERFLOW:
                    self.overflows += 1
            elif isinstance(event, BlockRemoved):
                if event.group_idx != 0 or event.medium not in _GPU_MEDIA:
                    self.skipped_events += 1
                    continue
                self.unknown_removed += index.remove(name, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                index.reset(name, complete=True)


def _same_batch(a: EventBatch, b: EventBatch) -> bool:
    """One batch, live or replayed (a replayed one has no topic frame)."""
    return a.seq == b.seq and a.ts == b.ts and a.events == b.events
