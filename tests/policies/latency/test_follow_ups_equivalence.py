"""`Joiners.step_began` in one pass against the pass per request it replaced (kept here as the
reference): the same share, sizes and `seen` for any step's batch whose credits are taken oldest
first, as `FollowUpCredits` hands them out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.latency.follow_ups import _WEIGHT, Joiners

# (uncached tokens, owed at dispatch or -1 when idle, took a credit?, credits given since the last)
_ENTRY = st.tuples(
    st.integers(0, 5_000), st.integers(-1, 8), st.booleans(), st.integers(0, 3)
)


def _reference(batch: list[tuple[int, int, int, int, int]]) -> tuple[float, float, float, dict[int, int]]:
    joined_sum = tokens_sum = owed_sum = 0.0
    seen: dict[int, int] = {}
    for i, (_, owed, _, newest, ident) in enumerate(batch):
        if owed < 0:
            seen[ident] = 0
            continue
        owed_sum += owed
        after = 0
        for uncached, _, took, _, _ in batch[i + 1 :]:
            after += uncached
            if 0 <= took <= newest:
                joined_sum += 1
                tokens_sum += uncached
        seen[ident] = after
    return joined_sum, tokens_sum, owed_sum, seen


@settings(max_examples=300, deadline=None)
@given(st.lists(_ENTRY, max_size=40))
def test_one_pass_equals_the_pass_per_request(entries: list[tuple[int, int, bool, int]]) -> None:
    batch: list[tuple[int, int, int, int, int]] = []
    newest = -1  # credits given so far, numbered in order
    taken = -1  # the newest credit taken: a dispatch takes the oldest left
    for ident, (uncached, owed_at, takes, given_now) in enumerate(entries):
        newest += given_now
        took = -1
        if takes and taken < newest:
            taken += 1
            took = taken
        batch.append((uncached, owed_at, took, newest, ident))
    joined, tokens, owed, seen = _reference(batch)

    joiners = Joiners()
    for uncached, owed_then, took, newest_then, ident in batch:
        joiners.dispatched(ident, uncached, max(owed_then, 0), owed_then >= 0, took, newest_then)
    joiners.step_began()
    assert joiners.seen == seen
    expected = Joiners()
    if owed > 0:  # the EWMA of one step from zero: its sums x the weight, in the same order
        expected._joined += _WEIGHT * joined
        expected._joined_tokens += _WEIGHT * tokens
        expected._owed += _WEIGHT * owed
    assert (joiners._joined, joiners._joined_tokens, joiners._owed) == (
        expected._joined, expected._joined_tokens, expected._owed,
    )  # fmt: skip
