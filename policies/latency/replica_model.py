"""One replica's latency model: what a new request would wait there for its first token, and between
tokens, from the work kvgate believes is ahead of it.

TTFT = wait + a + b x (tokens ahead + own uncached tokens) / 1000, never below one predicted decode
step. The engine runs steps back to back; a step computes the prefill it has room for (at most the
prior's `step_tokens`, vLLM's `--max-num-batched-tokens`) with one token of every decoding request,
and a prefill that ends in a step has its first token at the step's end.

- `wait` is what is left of the step under way on a busy replica. kvgate relays every token of its
  streams, so it knows when the replica's last step ended (`step_seen`): the step under way began
  then, and it is computing the prefill of the ledger's requests dispatched before it began (in
  dispatch order, up to `step_tokens`: `in_step_tokens`), so it lasts the longer of a decode step
  and their prefill. Without a recent chunk to date it (or once it is overdue), half a decode step
  (the mean wait of an arrival mid-step).
- own uncached tokens: the prompt minus the prefix the index believes the replica holds (the caller
  works it out: `LatencyEstimator.uncached_tokens`);
- tokens ahead: uncached prefill still to run there after the step under way. kvgate's own ledger is
  exact for what it sent (requests dispatched whose first token has not come back, with their
  uncached tokens as predicted at dispatch), less what the step under way is computing; a fresh
  scrape also shows requests waiting that other gateways sent, counted at the replica's mean
  uncached prompt. The larger of the two is taken (the scrape's waiting includes kvgate's own), and
  a stale scrape is not used at all: the ledger stays right between scrapes.
- A replica can hold requests back (no KV blocks free for the next one, or the step's budget spent):
  then what kvgate sent before the step under way may be waiting instead, so nothing is taken as
  under way. Two signs of it: a fresh scrape shows requests waiting, or the oldest request of the
  ledger was sent before the previous step began, fits one step and still has no first token.
- A request that will report no first token (a non-streaming answer) is dispatched with a due
  time, its dispatch plus its predicted TTFT, and leaves the ledger by itself then: the ledger is
  read against `now`, and what is due is dropped at that read.

TPOT = c + d x (KV tokens the running batch reads per step) / 100,000, the batch's context taken from
kvgate's in-flight tokens (prompt + output cap of what it sent), scaled up when a fresh scrape shows
more running requests than kvgate had sent when it was taken (`others_beyond`: not than kvgate has
in flight now, or its own request that ended since the scrape would still count as running).

Calibration (`LinearFit`) takes the TTFT and the mean inter-token time kvgate observes, with the
inputs that were predicted at dispatch.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from policies.latency.prior import LatencyPrior
from policies.latency.rls import LinearFit
from policies.types import ReplicaState

TTFT_X_TOKENS = 1000.0  # the TTFT fit's x unit: uncached prefill tokens
TPOT_X_TOKENS = 100_000.0  # the TPOT fit's x unit: KV tokens read per decode step
_MEAN_WEIGHT = 0.1  # EWMA weight of one dispatch in the mean uncached prompt
# Chunks closer together than this share of an unloaded decode step are one step's (its tokens reach
# kvgate together, one chunk per stream).
_SAME_STEP = 0.3
_NOT_TOLD = float("-inf")  # a due entry's dispatch time when the caller did not give one

# One replica's price for one request in one decision (`ReplicaLatencyModel.quote`), a plain tuple
# (built per candidate on the request path: a NamedTuple's constructor costs ~1k instructions more):
# (predicted TTFT s, own uncached tokens, the TTFT fit's slope (s per TTFT_X_TOKENS prefill tokens),
# requests running there, unloaded TTFT of the whole prompt s, a decode step of the batch running
# there s (0.0 when nothing runs): the knee's allowance for the step under way).
Quote = tuple[float, int, float, int, float, float]


def quote_costs(
    quotes: Sequence[Quote], work_weight: float = 0.0, stalls: list[float] | None = None
) -> list[float]:
    """Each quote's TTFT plus `work_weight` x the seconds of its own uncached prefill. With `stalls`,
    also appends each one's running requests x those seconds to it (0.0 where nothing runs)."""
    x = TTFT_X_TOKENS
    if stalls is None:
        if work_weight:
            return [t + work_weight * b * own / x for t, own, b, _, _, _ in quotes]
        return [q[0] for q in quotes]
    costs: list[float] = []
    cost, stall = costs.append, stalls.append
    unit = work_weight == 1.0  # then its work term is exactly its prefill's seconds: 1.0 x b == b
    for t, own, b, running, _, _ in quotes:
        prefill = b * own / x
        stall(running * prefill if running else 0.0)
        cost(t + prefill if unit else t + work_weight * b * own / x if work_weight else t)
    return costs


def others_beyond(state: ReplicaState, scraped: int) -> int:
    """Of `scraped` requests the last scrape counted (its running, or running + waiting), those beyond
    kvgate's own in flight then: other gateways', other clients'; at least 0. The caller checks the
    scrape is fresh."""
    mine = state.in_flight_at_scrape
    others = scraped - (state.in_flight if mine is None else mine)
    return others if others > 0 else 0


class ReplicaLatencyModel:
    """Mutable per-replica state: two fits, the pending-prefill ledger and a mean uncached prompt."""

    __slots__ = (
        "_in_step", "_ledger", "_split_key", "_version", "due", "last_step_at", "mean_uncached",
        "pending_requests", "pending_tokens", "prev_step_at", "prior", "tpot", "ttft",
    )  # fmt: skip

    def __init__(self, prior: LatencyPrior) -> None:
        self.prior = prior
        self.ttft = LinearFit(prior.ttft_fixed_s, prior.prefill_s_per_token * TTFT_X_TOKENS)
        self.tpot = LinearFit(prior.decode_step_s, prior.decode_s_per_kv_token * TPOT_X_TOKENS)
        self.pending_tokens = 0  # uncached prefill tokens of kvgate's requests awaiting a first token
        self.pending_requests = 0
        self.mean_uncached = 0.0  # of kvgate's dispatches here: prices a scraped waiting request
        self.last_step_at: float | None = None  # when a chunk of one of kvgate's streams here came
        self.prev_step_at: float | None = None  # the step before's (when the step before began)
        # The ledger's requests in dispatch order: (dispatched at, None where not told; uncached).
        self._ledger: deque[tuple[float | None, int]] = deque()
        self._version = 0  # bumped by every ledger change: `in_step_tokens` is cached against it
        self._split_key: tuple[float | None, int] = (None, -1)
        self._in_step = 0.0
        # (due time, uncached tokens, dispatched at or -inf) of the ledger's entries that leave by
        # themselves (a min-heap)
        self.due: list[tuple[float, int, float]] = []

    # -- inputs ---------------------------------------------------------------------------------

    def in_step_tokens(self, state: ReplicaState, fresh: bool) -> float:
        """Of the ledger's tokens, those the step under way is computing: dispatched before it began
        (the last chunk seen), in dispatch order, up to the prior's `step_tokens`; none when the
        replica is holding requests back (a fresh scrape shows some waiting, or the oldest of the
        ledger was sent before the previous step began and is still there). O(1) while neither the
        ledger nor the last chunk changed."""
        if fresh and state.waiting:
            return 0.0
        last = self.last_step_at
        key = (last, self._version)
        if key == self._split_key:
            return self._in_step
        total = 0
        budget = self.prior.step_tokens
        if last is not None and not self._head_held_back(budget):
            for at, tokens in self._ledger:
                if at is None or at >= last:
                    break
                total += tokens
                if total >= budget:
                    total = budget
                    break
        self._split_key = key
        self._in_step = float(total)
        return self._in_step

    def _head_held_back(self, budget: int) -> bool:
        """The oldest request of the ledger was sent before the previous step began and fits one
        step, yet that step ended without its first token: the replica is holding requests back."""
        prev = self.prev_step_at
        if not self._ledger or prev is None:
            return False
        at, tokens = self._ledger[0]
        return at is not None and at < prev and tokens <= budget

    def step_seen(self, at: float) -> bool:
        """A chunk of one of kvgate's streams here came at `at`: a step ended then (True), unless
        another chunk of the same step came just before (a step's chunks, one per stream, come
        together: False)."""
        last = self.last_step_at
        if last is not None and 0.0 <= at - last < _SAME_STEP * self.tpot.a:
            return False
        self.prev_step_at = last
        self.last_step_at = at
        return True

    def tokens_ahead(self, state: ReplicaState, fresh: bool, now: float) -> float:
        due = self.due
        if due and due[0][0] <= now:
            self.expire(now)
        own = self.pending_tokens - self.in_step_tokens(state, fresh)
        if fresh and state.waiting:
            scraped = state.waiting * self.mean_uncached
            return scraped if scraped > own else own
        return own

    def batch_kv_tokens(self, state: ReplicaState, fresh: bool) -> float:
        tokens = float(state.in_flight_tokens)
        others = others_beyond(state, state.running) if fresh else 0
        if others > 0:
            per_request = tokens / state.in_flight if state.in_flight else self.mean_uncached
            tokens += others * per_request
        return tokens

    # -- predictions ----------------------------------------------------------------------------

    def wait_s(self, batch_kv: float, now: float, in_step: float = 0.0) -> float:
        """What is left of the step under way (0 when idle), which computes `in_step` prefill tokens
        (`in_step_tokens`)."""
        if batch_kv <= 0:
            return 0.0
        step = self.tpot.predict(batch_kv / TPOT_X_TOKENS)
        length = self.ttft.predict(in_step / TTFT_X_TOKENS) if in_step else step
        if length < step:
            length = step
        last = self.last_step_at
        if last is not None and 0.0 <= now - last < length:
            return length - (now - last)
        return 0.5 * step

    def ttft_s(self, ahead: float, uncached: float, batch_kv: float, wait: float) -> float:
        step = self.tpot.predict(batch_kv / TPOT_X_TOKENS)
        ttft = wait + self.ttft.predict((ahead + uncached) / TTFT_X_TOKENS)
        return ttft if ttft > step else step

    def quote(self, state: ReplicaState, fresh: bool, uncached: int, whole_x: float, now: float) -> Quote:
        """One decision's price of this replica for a request with `uncached` tokens of its own to
        prefill here, its whole prompt `whole_x` x TTFT_X_TOKENS tokens (a `Quote`): `ttft_s` from
        `state`'s inputs, the fit's slope and the running requests for the work and stall terms
        (`quote_costs`), and for the knee the unloaded TTFT of the whole prompt (`ttft_s(0, whole,
        0, 0)`) and the decode step of the batch (0.0 with no batch). The request path's
        per-candidate call, inlined (the arithmetic of the methods above, about 3x faster)."""
        # batch_kv_tokens (others_beyond, inlined), and the requests decoding here for the stall
        # term: kvgate's in flight, or a fresh scrape's running if more. The batch is what the next
        # step reads now; the stall term's count also keeps the scrape's requests of kvgate's that
        # ended since, as their clients' next requests tend to follow them there (measured:
        # docs/benchmarks.md, "Live: the error kvgate logs, with the latency gate on").
        running = state.in_flight
        batch = float(state.in_flight_tokens)
        if fresh:
            mine = state.in_flight_at_scrape
            others = state.running - (running if mine is None else mine)
            if others > 0:
                per_request = batch / running if running else self.mean_uncached
                batch += others * per_request
            if state.running > running:
                running = state.running
        # tokens_ahead, and in_step_tokens (none while a fresh scrape shows requests waiting)
        due = self.due
        if due and due[0][0] <= now:
            self.expire(now)
        waiting = state.waiting if fresh else 0
        if waiting:
            in_step = 0.0
            ahead = float(self.pending_tokens)
            scraped = waiting * self.mean_uncached
            if scraped > ahead:
                ahead = scraped
        else:
            in_step = self.in_step_tokens(state, fresh)
            ahead = self.pending_tokens - in_step
        tpot, ttft = self.tpot, self.ttft
        ta, tb, step0 = ttft.a, ttft.b, tpot.a
        step = step0 + tpot.b * batch / TPOT_X_TOKENS
        cost = ta + tb * (ahead + uncached) / TTFT_X_TOKENS
        if batch > 0.0:  # wait_s
            length = ta + tb * in_step / TTFT_X_TOKENS if in_step else step
            if length < step:
                length = step
            last = self.last_step_at
            since = now - last if last is not None else -1.0
            cost += length - since if 0.0 <= since < length else 0.5 * step
            running_step = step
        else:
            running_step = 0.0
        if cost < step:
            cost = step
        # ttft_s(0.0, whole, 0.0, 0.0): nothing ahead, no batch (its step is the fit's intercept)
        unloaded = ta + tb * whole_x
        return cost, uncached, tb, running, unloaded if unloaded > step0 else step0, running_step

    def prefill_s(self, uncached: float) -> float:
        return self.ttft.b * uncached / TTFT_X_TOKENS

    def tpot_s(self, batch_kv: float) -> float:
        return self.tpot.predict(batch_kv / TPOT_X_TOKENS)

    # -- the ledger and calibration ---------------------------------------------------------------

    def dispatched(self, uncached: int, at: float | None = None, due_at: float | None = None) -> None:
        """A request with `uncached` tokens to prefill was sent at `at` (the caller's clock; None:
        not told, and then it is never taken as under way). With `due_at` it will report no first
        token: it leaves the ledger by itself at `due_at` (or at `prefilled`, if sooner)."""
        if due_at is not None:
            heapq.heappush(self.due, (due_at, uncached, _NOT_TOLD if at is None else at))
        self.pending_tokens += uncached
        self.pending_requests += 1
        self._ledger.append((at, uncached))
        self._version += 1
        if self.mean_uncached:
            self.mean_uncached += _MEAN_WEIGHT * (uncached - self.mean_uncached)
        else:  # the first dispatch here (or only cached ones so far): no 0 to average away
            self.mean_uncached = float(uncached)

    def prefilled(self, uncached: int, at: float | None = None, due_at: float | None = None) -> None:
        """A request counted by `dispatched(uncached, at, due_at)` got its first token (or ended
        without one): it leaves the ledger, unless it was due and a read has let it go already. A
        caller that does not give `at` lets go of the oldest request of that size."""
        if due_at is not None:
            try:  # any entry alike is the same to the ledger
                self.due.remove((due_at, uncached, _NOT_TOLD if at is None else at))
            except ValueError:
                return  # it was due: gone already
            heapq.heapify(self.due)
        self._release(uncached, at)

    def expire(self, now: float) -> None:
        """Drop the ledger's entries due by `now` (their prefill is predicted done)."""
        due = self.due
        while due and due[0][0] <= now:
            _, uncached, at = heapq.heappop(due)
            self._release(uncached, None if at == _NOT_TOLD else at)

    def _release(self, uncached: int, at: float | None) -> None:
        self.pending_requests = max(self.pending_requests - 1, 0)
        left = self.pending_tokens - uncached
        self.pending_tokens = left if left > 0 and self.pending_requests else 0
        ledger = self._ledger
        try:
            ledger.remove((at, uncached))
        except ValueError:
            for entry in ledger:
                if entry[1] == uncached:
                    ledger.remove(entry)
                    break
        while len(ledger) > self.pending_requests:  # never more entries than requests pending
            ledger.popleft()
        self._version += 1

    def observe_ttft(self, ahead: float, uncached: float, wait: float, ttft_s: float) -> bool:
        # The prefill's own part: without the predicted wait for the step under way.
        return self.ttft.update((ahead + uncached) / TTFT_X_TOKENS, ttft_s - wait)

    def observe_tpot(self, batch_kv: float, tpot_s: float) -> bool:
        return self.tpot.update(batch_kv / TPOT_X_TOKENS, tpot_s)
