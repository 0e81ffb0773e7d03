"""Requests that will join a request's step: follow-ups of streams that just ended.

A closed-loop client (a benchmark harness, an agent, a batch job) sends its next request as soon as
its last one ends. Streams that end in one engine step have their follow-ups sent together, and the
engine computes all of them that reach a replica before its next step begins in that step: the first
request of such a burst has its first token only when the step has prefilled its burst-mates too,
which its ticket cannot hold (they are dispatched after it). Measured on the DES's shared-prefix
workload at 16 streams per replica, that was 39% of requests, predicted 28% under their TTFT.

What kvgate knows at dispatch is how many of its streams ended just before and how many requests it
has dispatched since; what it does not know is where routing will send the rest. So:

- `FollowUpCredits` (one per estimator): each ended stream leaves a credit that expires after a
  window (the ending replica's unloaded decode step: a follow-up later than that is not part of the
  burst); each dispatch takes the oldest credit. The credits left at a dispatch are the follow-ups
  still to come (`owed`).
- `Joiners` (one per replica): the share of owed follow-ups that reached this replica before the
  request's step began, and their mean uncached tokens, calibrated from what happened. kvgate sees
  each step begin (the chunks of the step before: `ReplicaLatencyModel.step_seen`); the requests it
  dispatched to the replica since the previous step began join the next step together, so each was
  joined by those dispatched after it. Of those, the ones it was owed (they took a credit left at
  its dispatch) count, as exponentially weighted sums over the owed counts. The share starts at 0:
  with no closed-loop traffic (follow-ups never come, or later than the window) the credits expire
  or go unmatched, and there is no term.
- Every request that joined (owed or not: most come from streams that end after the dispatch, on
  other replicas, which no ticket can know) is also kept per ticket (`Joiners.seen`), for the TTFT
  fit to calibrate with: without them the fit takes their prefill as the request's own, and
  over-predicts every request that nobody joins.

A request's expected joiners are the whole follow-ups that `share` x `owed` makes (rounded down: a
follow-up joins or does not, and the mean of a share under one half put on every request is the
larger error; measured, the mean instead made multi-turn and `default`-routed predictions worse),
each of the mean size of those that joined, and only on a busy replica (an idle one begins a step
with the request alone). Pure: the caller passes times.
"""

from __future__ import annotations

from collections import deque

_WEIGHT = 0.05  # EWMA weight of one settled step in the share's sums
# Requests dispatched to a replica with no step seen since: more than vLLM's default `max_num_seqs`
# (256) cannot have joined one step; a replica serving only non-streaming answers never shows one.
_MAX_BATCH = 1024


class FollowUpCredits:
    """The follow-ups still to come of streams that ended recently (module docstring). Credits are
    numbered in order of ending: a dispatch takes the oldest, so the credits left at one dispatch are
    the ones later dispatches take, up to the newest number then (`newest`)."""

    __slots__ = ("_expiry", "_next")

    def __init__(self) -> None:
        self._expiry: deque[tuple[float, int]] = deque()  # (expires at, number) per ended stream
        self._next = 0

    def ended(self, expires_at: float) -> None:
        """A stream ended: its follow-up, if any, is expected until `expires_at`."""
        self._expiry.append((expires_at, self._next))
        self._next += 1

    def owed(self, now: float) -> int:
        """Credits left at `now` (expired ones dropped)."""
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            expiry.popleft()
        return len(expiry)

    @property
    def newest(self) -> int:
        """The number of the newest credit given so far (-1: none yet)."""
        return self._next - 1

    def take(self) -> int:
        """A request was dispatched: it is the follow-up of the oldest credit. Its number (-1: none
        was left)."""
        return self._expiry.popleft()[1] if self._expiry else -1


class Joiners:
    """One replica's uncached tokens per owed follow-up that joined a request's step, and the
    requests dispatched there since its last step began (module docstring)."""

    __slots__ = ("_batch", "_joined", "_joined_tokens", "_owed", "seen")

    def __init__(self) -> None:
        self._joined = 0.0  # EWMA sums: owed follow-ups that joined a step, their uncached tokens ...
        self._joined_tokens = 0.0
        self._owed = 0.0  # ... and the follow-ups owed at those requests' dispatch
        # (uncached tokens, owed at dispatch or -1 when dispatched to an idle replica, the credit it
        # took or -1, the newest credit at its dispatch) of the requests dispatched since the last
        # step began
        self._batch: list[tuple[int, int, int, int, int]] = []
        # ident -> uncached tokens dispatched after it that joined its step, for the caller to pop
        self.seen: dict[int, int] = {}

    @property
    def share(self) -> float:
        """Of the follow-ups owed at a dispatch, the share that joined its step."""
        return self._joined / self._owed if self._owed > 0.0 else 0.0

    def expected_tokens(self, owed: int) -> float:
        """Uncached tokens expected to join the step of a request dispatched with `owed` follow-ups
        still to come: the whole follow-ups among them that `share` makes (rounded down: a follow-up
        joins or does not, and to predict one that probably does not is the larger error), each of
        the mean size of those that joined."""
        joiners = int(owed * self.share) if owed > 0 else 0
        return joiners * self._joined_tokens / self._joined if joiners else 0.0

    def dispatched(self, ident: int, uncached: int, owed: int, busy: bool, took: int, newest: int) -> None:
        batch = self._batch
        if len(batch) >= _MAX_BATCH:  # no step seen for that long (no streams there): not one step
            batch.clear()
        batch.append((uncached, owed if busy else -1, took, newest, ident))

    def ended(self, ident: int) -> None:
        """Request `ident` ended: it leaves `seen`, and the requests waiting for a step if it is
        still there (it ended before any step was seen to begin with it: a failed attempt, say),
        so a later step neither counts it as a joiner nor keeps a `seen` entry nobody will take."""
        if self.seen.pop(ident, None) is None:
            batch = self._batch
            for i in range(len(batch) - 1, -1, -1):
                if batch[i][4] == ident:
                    del batch[i]
                    break

    def step_began(self) -> None:
        """A step began: the requests dispatched here since the last one are in it. Each was joined
        by those dispatched after it; of those, the follow-ups it was owed (they took a credit that
        was left at its dispatch) calibrate the tokens per owed follow-up.

        One pass, not a pass per request: credits are taken oldest first, so the credits taken rise
        with the dispatch order, and so does the newest credit at each dispatch. The follow-ups a
        request was owed are then the credit-takers after it up to a bound that only moves forward."""
        batch = self._batch
        if not batch:
            return
        # The credit-takers in dispatch order: positions, and running sums of their uncached tokens.
        takers = [pos for pos, entry in enumerate(batch) if entry[2] >= 0]
        taken_tokens = [0]
        for pos in takers:
            taken_tokens.append(taken_tokens[-1] + batch[pos][0])
        after = sum(entry[0] for entry in batch)  # uncached tokens dispatched after the current one
        before = 0  # takers at or before the current position
        owed_up_to = 0  # takers whose credit was given by the current request's dispatch
        joined_sum = 0.0
        tokens_sum = 0.0
        owed_sum = 0.0
        seen = self.seen
        for uncached, owed, took, newest, ident in batch:
            after -= uncached
            if took >= 0:
                before += 1
            while owed_up_to < len(takers) and batch[takers[owed_up_to]][2] <= newest:
                owed_up_to += 1
            if owed < 0:  # an idle replica's step began with that request alone: not counted
                seen[ident] = 0
                continue
            owed_sum += owed
            if owed_up_to > before:
                joined_sum += owed_up_to - before
                tokens_sum += taken_tokens[owed_up_to] - taken_tokens[before]
            seen[ident] = after
        if owed_sum > 0.0:
            self._joined += _WEIGHT * (joined_sum - self._joined)
            self._joined_tokens += _WEIGHT * (tokens_sum - self._joined_tokens)
            self._owed += _WEIGHT * (owed_sum - self._owed)
        batch.clear()
