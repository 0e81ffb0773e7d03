"""The batch-sequence state machine: in order, gaps and their replays, lost batches, restarts."""

from __future__ import annotations

from policies.kv_sequence import Apply, Replay, Reset, SequenceTracker, Step

FRESH = Reset(complete=True)
LOST = Reset(complete=False)


def tracker(can_replay: bool = True, max_held: int = 100) -> SequenceTracker[str]:
    return SequenceTracker(can_replay, max_held)


def live(t: SequenceTracker[str], *seqs: int) -> list[Step[str]]:
    out: list[Step[str]] = []
    for s in seqs:
        out += t.live(s, f"b{s}")
    return out


def replay(t: SequenceTracker[str], *seqs: int, ok: bool = True) -> list[Step[str]]:
    out: list[Step[str]] = []
    for s in seqs:
        out += t.replayed(s, f"b{s}")
    return out + t.replay_ended(ok)


def a(*seqs: int) -> list[Step[str]]:
    return [Apply(f"b{s}") for s in seqs]


def test_in_order_from_zero() -> None:
    t = tracker()
    assert live(t, 0, 1, 2) == [FRESH, *a(0, 1, 2)]
    assert t.in_order and t.expected == 3


def test_joining_mid_stream_asks_for_the_history_from_zero() -> None:
    t = tracker()
    assert live(t, 5) == [Replay(0)]
    assert not t.in_order
    assert live(t, 6) == []  # held while the replay runs
    assert replay(t, 0, 1, 2, 3, 4, 5) == [FRESH, *a(0, 1, 2, 3, 4, 5, 6)]
    assert t.in_order and t.replays_filled == 1 and t.losses == 0


def test_joining_mid_stream_when_the_buffer_no_longer_has_zero() -> None:
    t = tracker()
    live(t, 5)
    assert replay(t, 3, 4) == [LOST, *a(3, 4, 5)]
    assert t.in_order and t.losses == 1 and t.replays_filled == 0


def test_a_gap_is_filled_by_a_replay_and_held_batches_follow_in_order() -> None:
    t = tracker()
    live(t, 0, 1)
    assert live(t, 4) == [Replay(2)]
    assert live(t, 5) == []
    # The replay also brings 4 and 5 (published before it was served): they are applied once.
    assert replay(t, 2, 3, 4, 5) == a(2, 3, 4, 5)
    assert t.gaps == 1 and t.replays_filled == 1 and t.skipped == 2
    assert live(t, 6) == a(6)


def test_a_replay_that_starts_past_the_gap_loses_it() -> None:
    t = tracker()
    live(t, 0, 1)
    live(t, 9)
    assert replay(t, 5, 6, 7, 8, 9) == [LOST, *a(5, 6, 7, 8, 9)]  # the held 9 is skipped
    assert t.losses == 1 and t.in_order and t.expected == 10


def test_a_replay_that_brings_nothing_or_fails_loses_the_gap() -> None:
    for ok in (True, False):
        t = tracker()
        live(t, 0)
        live(t, 3, 4)
        assert replay(t, ok=ok) == [LOST, *a(3, 4)]
        assert t.losses == 1 and t.expected == 5 and t.replays_filled == 0


def test_without_a_replay_socket_a_gap_is_lost_at_once() -> None:
    t = tracker(can_replay=False)
    assert live(t, 0, 3) == [FRESH, *a(0), LOST, *a(3)]
    t2 = tracker(can_replay=False)
    assert live(t2, 7) == [LOST, *a(7)]  # joining mid-stream: the picture is incomplete


def test_a_sequence_back_to_zero_is_a_restarted_engine() -> None:
    t = tracker()
    live(t, 0, 1, 2)
    assert live(t, 0, 1) == [FRESH, *a(0, 1)]
    assert t.restarts == 1


def test_a_restarted_engine_whose_first_batches_were_missed() -> None:
    t = tracker()
    live(t, 0, 1, 2, 3, 4, 5)
    assert live(t, 2) == [LOST, Replay(0)]  # the old engine's blocks are gone either way
    assert replay(t, 0, 1, 2) == [FRESH, *a(0, 1, 2)]
    assert t.restarts == 1 and t.in_order


def test_a_restart_while_a_replay_is_pending() -> None:
    t = tracker()
    live(t, 0, 1)
    live(t, 5)
    t.live(0, "new-b0")  # the engine restarted meanwhile
    assert replay(t, 2, 3, 4, 5) == [*a(2, 3, 4, 5), FRESH, Apply("new-b0")]
    assert t.restarts == 1 and t.expected == 1


def test_too_many_held_batches_end_the_replay_as_failed() -> None:
    t = tracker(max_held=2)
    live(t, 0)
    live(t, 3, 4)
    assert live(t, 5) == [LOST, *a(3, 4, 5)]
    assert not t.replaying
    assert t.replayed(1, "late") == [] and t.replay_ended(True) == []  # a late answer is ignored


def test_after_a_reconnection_the_same_engine_is_recognised_and_nothing_is_lost() -> None:
    t = tracker()
    live(t, 0, 1, 2)
    assert t.reconnected() == [Replay(2)]  # the last batch applied, to compare
    assert live(t, 4) == []  # held meanwhile
    assert replay(t, 2, 3, 4) == a(3, 4)  # 2 is the batch it had: same engine; 3 was missed
    assert t.restarts == 0 and t.losses == 0 and t.reconnects == 1 and t.in_order


def test_after_a_reconnection_another_engine_numbering_on_from_the_same_place_is_caught() -> None:
    t: SequenceTracker[str] = SequenceTracker(True, same=lambda x, y: x == y)
    live(t, 0, 1)  # the old engine's 0 and 1
    t.reconnected()
    # A restarted engine whose batch 0 was missed: its 1 would look like a continuation. Its
    # history is asked for whole, in place of the replay in flight.
    assert t.replayed(1, "new-b1") == [LOST, Replay(0)]
    assert t.replayed(0, "new-b0") == [FRESH, Apply("new-b0")]
    assert t.replayed(1, "new-b1") == [Apply("new-b1")]
    assert t.replay_ended(True) == []
    assert t.restarts == 1 and t.in_order and t.expected == 2 and t.replays == 2


def test_after_a_reconnection_a_new_engine_replayed_from_zero_is_complete_at_once() -> None:
    t = tracker()
    live(t, 0)
    assert t.reconnected() == [Replay(0)]
    assert t.replayed(0, "new-b0") == [FRESH, Apply("new-b0")]
    assert replay(t, 1) == a(1)
    assert t.restarts == 1


def test_after_a_reconnection_a_replay_that_brings_nothing_starts_over() -> None:
    t = tracker()
    live(t, 0, 1, 2)
    t.reconnected()
    live(t, 5)
    assert t.replay_ended(False) == [LOST, Replay(0)]  # the held 5 asks for the new engine's history
    assert replay(t, 0, 1, 2, 3, 4, 5) == [FRESH, *a(0, 1, 2, 3, 4, 5)]


def test_after_a_reconnection_a_new_engine_with_a_shorter_history_is_asked_for_it_at_once() -> None:
    t = tracker()
    live(t, 0, 1, 2)
    assert t.reconnected() == [Replay(2)]
    # Nothing from 2 on: the engine there has published fewer batches than ours (a restart).
    assert t.replay_ended(True) == [LOST, Replay(0)]
    assert replay(t, 0, 1) == [FRESH, *a(0, 1)]
    assert t.in_order and t.expected == 2 and t.restarts == 1 and t.replays == 2


def test_after_a_reconnection_a_new_engine_that_published_nothing_waits_for_its_first_batch() -> None:
    t = tracker()
    live(t, 0, 1, 2)
    t.reconnected()
    assert t.replay_ended(True) == [LOST, Replay(0)]
    assert replay(t) == []  # nothing published yet
    assert t.in_order and t.expected == 0
    assert live(t, 0) == [FRESH, *a(0)]  # its first batch: complete from there


def test_a_reconnection_before_any_batch_or_without_a_replay_socket_changes_nothing() -> None:
    assert tracker().reconnected() == []
    t = tracker(can_replay=False)
    live(t, 0)
    assert t.reconnected() == [] and live(t, 1) == a(1)


def test_a_new_engines_first_batch_both_held_and_replayed_is_applied_once() -> None:
    t: SequenceTracker[str] = SequenceTracker(True, same=lambda x, y: x == y)
    live(t, 0, 1, 2)
    t.reconnected()
    assert t.live(0, "new-b0") == []  # the new engine's first batch arrives live, held
    assert t.replayed(0, "new-b0") == [FRESH, Apply("new-b0")]  # and again from its replay buffer
    assert t.replayed(1, "new-b1") == [Apply("new-b1")]
    assert t.replay_ended(True) == []  # the held copy of 0 is the batch already applied
    assert t.restarts == 1 and t.expected == 2
