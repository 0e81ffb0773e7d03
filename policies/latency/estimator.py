"""`LatencyEstimator`: every replica's latency model, and the tickets between a dispatch and what it got.

The request path asks it twice. Scheduling (the `latency-knee` filter and the `predicted-latency`
scorer) prices each candidate once per decision (`price`: a few float operations and a tuple, no
other allocation beyond the replica's model on first sight). The dispatch (each attempt) calls
`predict` for the replica tried and `dispatched` with the result: the `Prediction` is the ticket the
gateway keeps until the answer's first token (`prefilled`, `started`, then `observe_ttft`) and its
end (`observe_tpot`, `ended`). The latency gate, before routing, prices a request on each replica of
its pool with `gate_ttft_s`: a ticket's TTFT for its whole prompt, the KV wait included. A ticket
predicted with the request's prompt and output cap also joins
the replica's KV ledger (`kv_admission`) until `ended`: the TTFT of a later request there includes
its wait for free KV blocks, when the replica's capacity is known. The TTFT fit still calibrates on
the whole observed TTFT less the step under way (the KV wait is not subtracted: measured,
subtracting it moved routing and cost goodput; docs/benchmarks.md, "KV-block admission in the TTFT
model"), but with the prefill of the requests seen to join its step (dispatched there after it,
before the step began): else the fit takes their prefill as the request's own and over-predicts
every request that nobody joins. A ticket also counts the follow-ups of streams that just ended that
are expected to join its step (`follow_ups`; `ended` with the time). Observations calibrate the
replica's model only when the prediction's inputs were fresh (its scrape within `stale_after_s` at
dispatch): a TTFT that waited behind a queue the gateway could not see says nothing about the
replica's prefill rate.

Replicas are keyed by name; a replica's prior is its pool's (`priors`), else `default_prior`. Pure and
single-threaded: the caller passes `now` and owns the instance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from policies.latency.follow_ups import FollowUpCredits, Joiners
from policies.latency.kv_admission import KvLedger
from policies.latency.prior import LatencyPrior
from policies.latency.replica_model import (
    TPOT_X_TOKENS,
    TTFT_X_TOKENS,
    Quote,
    ReplicaLatencyModel,
    quote_costs,
)
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class Prediction:
    """What was predicted for one dispatch, with the inputs it was predicted from (tokens; seconds)."""

    replica: str
    pool: str
    ahead_tokens: float
    uncached_tokens: int
    batch_kv_tokens: float
    wait_s: float  # predicted rest of the step under way
    ttft_s: float
    tpot_s: float
    fresh: bool  # the replica's scrape was fresh at dispatch: observations may calibrate
    at: float | None = None  # when predicted (the caller's `now`): dates the dispatch in the ledger
    due_at: float | None = None  # no first token will come back: the ledger lets it go at this time
    # The KV-block admission ledger's inputs (`kv_admission`): the ticket's number there, the prompt
    # and output cap it holds blocks for, its prefix keys (its group), and the predicted wait for
    # free blocks that `ttft_s` includes.
    ident: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefix_keys: tuple[int, ...] = ()
    kv_wait_s: float = 0.0
    # Follow-ups of streams that just ended still to come at dispatch, and the uncached tokens of
    # them expected to join this request's step, which `ttft_s` includes (`follow_ups`).
    owed: int = 0
    joined_tokens: float = 0.0


class LatencyEstimator:
    """Per-replica `ReplicaLatencyModel`s (module docstring). `block_tokens` is the prefix index's
    block size in tokens: `prefix_match` counts convert to cached tokens with it."""

    __slots__ = (
        "_credits", "_idents", "_joiners", "_kv", "_models", "block_tokens", "default_prior", "priors",
    )  # fmt: skip

    def __init__(
        self,
        block_tokens: int,
        priors: Mapping[str, LatencyPrior] | None = None,
        default_prior: LatencyPrior | None = None,
    ) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self.priors: Mapping[str, LatencyPrior] = MappingProxyType(dict(priors or {}))
        self.default_prior = default_prior or LatencyPrior()
        self._models: dict[str, ReplicaLatencyModel] = {}
        # Per replica, kvgate's requests in flight there as KV blocks (kept across a reload of the
        # priors: the requests are still there).
        self._kv: dict[str, KvLedger] = {}
        self._idents = 0
        self._credits = FollowUpCredits()  # follow-ups of ended streams still to come (fleet-wide)
        self._joiners: dict[str, Joiners] = {}  # per replica: the share of them that joins a step

    def set_priors(self, priors: Mapping[str, LatencyPrior], default_prior: LatencyPrior) -> None:
        """New priors (a reload). When they differ from the old ones every replica starts over from
        them (its calibration was relative to numbers the operator just said were wrong); the same
        priors keep every replica's calibration and ledger."""
        if dict(priors) == dict(self.priors) and default_prior == self.default_prior:
            return
        self.priors = MappingProxyType(dict(priors))
        self.default_prior = default_prior
        self._models.clear()

    def model(self, replica: str, pool: str) -> ReplicaLatencyModel:
        model = self._models.get(replica)
        if model is None:
            model = self._models[replica] = ReplicaLatencyModel(self.priors.get(pool, self.default_prior))
        return model

    def models(self) -> Mapping[str, ReplicaLatencyModel]:
        """Every replica's model (read-only view, for metrics and the admin API)."""
        return MappingProxyType(self._models)

    def forget(self, replica: str) -> None:
        """The replica left (or restarted at a new address): its calibration and ledger go."""
        self._models.pop(replica, None)
        self._kv.pop(replica, None)
        self._joiners.pop(replica, None)

    def uncached_tokens(self, prompt_tokens: int, matched_blocks: float) -> int:
        """The prompt's tokens a replica believed to hold `matched_blocks` index blocks must prefill."""
        uncached = prompt_tokens - int(matched_blocks * self.block_tokens)
        return uncached if uncached > 0 else 0

    # -- the request path -------------------------------------------------------------------------

    def ttft_s(self, state: ReplicaState, uncached: int, now: float, stale_after_s: float) -> float:
        """Predicted seconds from dispatch to the first token of a request with `uncached` tokens to
        prefill, on `state`'s replica now."""
        return self.ttft_and_step_s(state, uncached, now, stale_after_s)[0]

    def ttft_and_step_s(
        self, state: ReplicaState, uncached: int, now: float, stale_after_s: float
    ) -> tuple[float, float]:
        """`ttft_s`, and a decode step of the batch running on `state`'s replica (kvgate's in flight
        and a fresh scrape's running beyond them; 0.0 when nothing runs there): the wait for the step
        under way that the latency gate's knee allows for (`latency_admission.knee_bound_s`). One
        pass over the replica's inputs: the gate prices every replica of a pool per admission."""
        model = self._models.get(state.name) or self.model(state.name, state.pool)
        fresh = state.scraped_at is not None and now - state.scraped_at <= stale_after_s
        batch = model.batch_kv_tokens(state, fresh)
        ahead = model.tokens_ahead(state, fresh, now)  # first: lets what is due leave the ledger
        wait = model.wait_s(batch, now, model.in_step_tokens(state, fresh))
        ttft = model.ttft_s(ahead, uncached, batch, wait)
        if batch <= 0:
            return ttft, 0.0
        tpot = model.tpot
        return ttft, tpot.a + tpot.b * batch / TPOT_X_TOKENS  # the step as `quote` works it out, to the bit

    def unloaded_ttft_s(self, state: ReplicaState, uncached: int) -> float:
        """Predicted TTFT of a request with `uncached` tokens to prefill on `state`'s replica with
        nothing ahead of it and nothing running: what the admission gate's knee is a multiple of."""
        model = self._models.get(state.name) or self.model(state.name, state.pool)
        return model.ttft_s(0.0, uncached, 0.0, 0.0)

    def price(
        self,
        states: Sequence[ReplicaState],
        prompt_tokens: int,
        matched: Mapping[str, float],
        now: float,
        stale_after_s: float,
        memo: dict[str, Quote],
    ) -> list[Quote]:
        """Each state's `Quote` (`ReplicaLatencyModel.quote`) for a `prompt_tokens` prompt of which the
        replica is believed to hold `matched[name]` index blocks: one decision's pricing pass. `memo`
        holds the decision's quotes by replica name: a state found there is not priced again, the
        others join it, so the decision's filters and scorers price each candidate once
        (`SchedulingContext.quotes`). The request path calls it for every candidate."""
        models = self._models
        block = self.block_tokens
        get = matched.get
        whole_x = prompt_tokens / TTFT_X_TOKENS
        out = []
        for state in states:
            name = state.name
            if name in memo:
                quote = memo[name]
            else:
                model = models.get(name) or self.model(name, state.pool)
                scraped = state.scraped_at
                fresh = scraped is not None and now - scraped <= stale_after_s
                held = get(name, 0) * block  # an int from the approximate index: int() only for a fraction
                own = prompt_tokens - (held if held.__class__ is int else int(held))
                quote = memo[name] = model.quote(state, fresh, own if own > 0 else 0, whole_x, now)
            out.append(quote)
        return out

    def costs(
        self,
        states: Sequence[ReplicaState],
        prompt_tokens: int,
        matched: Mapping[str, float],
        now: float,
        stale_after_s: float,
        work_weight: float = 0.0,
        stalls: list[float] | None = None,
    ) -> list[float]:
        """For each state: `ttft_s` of a `prompt_tokens` prompt of which the replica is believed to hold
        `matched[name]` index blocks, plus `work_weight` x `prefill_s` of its uncached part. With
        `stalls`, also appends each state's running requests (kvgate's in flight, or a fresh scrape's
        running if more) x `prefill_s` of its uncached part to it (0.0 where nothing runs). `price`
        and `quote_costs` in one call, for a caller with no decision's quotes to share."""
        quotes = self.price(states, prompt_tokens, matched, now, stale_after_s, {})
        return quote_costs(quotes, work_weight, stalls)

    def kv_wait_s(
        self,
        state: ReplicaState,
        prompt_tokens: int,
        prefix_keys: tuple[int, ...],
        now: float,
        stale_after_s: float,
    ) -> float:
        """The predicted wait for free KV blocks of a `prompt_tokens` prompt with `prefix_keys` sent
        to `state`'s replica now: the play of its KV-block ledger that `predict` makes for a ticket
        (0.0 without a ledger there, or while the replica's capacity is unknown)."""
        if prompt_tokens <= 0 or state.name not in self._kv:
            return 0.0  # (before the TPOT, which only a play needs)
        model = self.model(state.name, state.pool)
        fresh = state.scraped_at is not None and now - state.scraped_at <= stale_after_s
        batch = model.batch_kv_tokens(state, fresh)
        tpot = model.tpot_s(batch)
        return self._kv_play(state, model, tpot, prompt_tokens, prefix_keys, now, batch, fresh)[0]

    def gate_ttft_s(
        self, state: ReplicaState, prompt_tokens: int, prefix_keys: tuple[int, ...], now: float,
        stale_after_s: float, ttft: float | None = None, limit_s: float = math.inf,
    ) -> float:  # fmt: skip
        """`ttft_s` of a whole `prompt_tokens` prompt, its wait for free KV blocks included as a
        ticket's is (`predict`): what the latency gate prices a request at on `state`'s replica.
        `ttft`: that `ttft_s`, when the caller has just worked it out (not worked out again).
        `limit_s`: a caller that only needs to know whether the price is over it; once the wait for
        blocks passes it, the play stops there and the price returned is over `limit_s` but may be
        under the whole play's (`kv_admission.admission_wait_s`)."""
        if ttft is None:
            ttft = self.ttft_s(state, prompt_tokens, now, stale_after_s)
        if prompt_tokens <= 0 or state.name not in self._kv:
            return ttft
        model = self.model(state.name, state.pool)
        fresh = state.scraped_at is not None and now - state.scraped_at <= stale_after_s
        batch = model.batch_kv_tokens(state, fresh)
        return self._with_kv_wait(state, model, ttft, prompt_tokens, batch, model.tpot_s(batch),
                                  prompt_tokens, prefix_keys, now, fresh, limit_s)[1]  # fmt: skip

    def _with_kv_wait(self, state: ReplicaState, model: ReplicaLatencyModel, ttft: float, uncached: int,
                      batch: float, tpot_s: float, prompt_tokens: int, prefix_keys: tuple[int, ...],
                      now: float, fresh: bool, limit_s: float = math.inf) -> tuple[float, float]:  # fmt: skip
        """(the wait for free KV blocks, `ttft` with it): once blocks are free the request is admitted,
        its prefill then shares steps with the requests admitted at that instant, and no step is under
        way for it to wait for."""
        kv_wait, with_tokens = self._kv_play(state, model, tpot_s, prompt_tokens, prefix_keys, now, batch,
                                             fresh, limit_s)  # fmt: skip
        if kv_wait > 0:
            later = model.ttft_s(float(with_tokens), uncached, batch, 0.0)
            if kv_wait + later > ttft:
                ttft = kv_wait + later
        return kv_wait, ttft

    def _kv_play(self, state: ReplicaState, model: ReplicaLatencyModel, tpot_s: float, prompt_tokens: int,
                 prefix_keys: tuple[int, ...], now: float, batch: float, fresh: bool,
                 limit_s: float = math.inf) -> tuple[float, int]:  # fmt: skip
        """(wait for free KV blocks, prefill tokens admitted beside it) on `state`'s replica; (0, 0)
        without a ledger there or a prompt. Cut short past `limit_s` (`KvLedger.wait_s`). The
        running requests' next step ends no earlier than the step under way (the model's rest of it,
        `ReplicaLatencyModel.wait_s`, as the ticket's TTFT waits for it)."""
        ledger = self._kv.get(state.name)
        if ledger is None or prompt_tokens <= 0:
            return 0.0, 0
        if ledger.fits_at_full_length(state.block_size, state.num_gpu_blocks, prompt_tokens):
            return 0.0, 0  # (the tokens admitted beside it are read only when it waits)
        return ledger.wait_s(
            now, tpot_s, state.block_size, state.num_gpu_blocks, prompt_tokens, prefix_keys,
            model.prefill_s(1.0), limit_s, now + model.wait_s(batch, now, model.in_step_tokens(state, fresh)),
        )  # fmt: skip

    def prefill_s(self, state: ReplicaState, uncached: int) -> float:
        """Seconds of `state`'s replica's compute that `uncached` prefill tokens take (the marginal
        part of the TTFT fit: without its fixed cost)."""
        model = self._models.get(state.name) or self.model(state.name, state.pool)
        return model.prefill_s(uncached)

    def tpot_s(self, state: ReplicaState, now: float, stale_after_s: float) -> float:
        """Predicted seconds between two output tokens on `state`'s replica now."""
        model = self._models.get(state.name) or self.model(state.name, state.pool)
        fresh = state.scraped_at is not None and now - state.scraped_at <= stale_after_s
        return model.tpot_s(model.batch_kv_tokens(state, fresh))

    def predict(
        self,
        state: ReplicaState,
        uncached: int,
        now: float,
        stale_after_s: float,
        *,
        prompt_tokens: int = 0,
        output_tokens: int = 0,
        prefix_keys: tuple[int, ...] = (),
    ) -> Prediction:
        """The ticket for a dispatch to `state`'s replica (pass it to `dispatched`). With
        `prompt_tokens` (and the request's output cap and prefix keys) the ticket joins the replica's
        KV-block ledger at dispatch, and its TTFT includes the wait for free KV blocks
        (`kv_admission`) when the replica's capacity is known (`state.num_gpu_blocks`)."""
        model = self.model(state.name, state.pool)
        fresh = state.scraped_at is not None and now - state.scraped_at <= stale_after_s
        ahead = model.tokens_ahead(state, fresh, now)
        batch = model.batch_kv_tokens(state, fresh)
        wait = model.wait_s(batch, now, model.in_step_tokens(state, fresh))
        tpot = model.tpot_s(batch)
        owed = self._credits.owed(now) - 1  # this request is one of them, if any
        owed = owed if owed > 0 else 0
        joiners = self._joiners.get(state.name)
        joined = joiners.expected_tokens(owed) if joiners and batch > 0 else 0.0
        ttft = model.ttft_s(ahead + joined, uncached, batch, wait)
        kv_wait, ttft = self._with_kv_wait(state, model, ttft, uncached, batch, tpot, prompt_tokens,
                                           prefix_keys, now, fresh)  # fmt: skip
        self._idents += 1
        return Prediction(
            replica=state.name,
            pool=state.pool,
            ahead_tokens=ahead,
            uncached_tokens=uncached,
            batch_kv_tokens=batch,
            wait_s=wait,
            ttft_s=ttft,
            tpot_s=tpot,
            fresh=fresh,
            at=now,
            ident=self._idents,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            prefix_keys=prefix_keys,
            kv_wait_s=kv_wait,
            owed=owed,
            joined_tokens=joined,
        )

    def dispatched(self, p: Prediction, now: float | None = None) -> Prediction:
        """The request of ticket `p` was sent: its uncached tokens are ahead of later ones there.
        Returns the ticket to keep. `now` (the dispatch's time) for a request that will report no
        first token (a non-streaming answer): its tokens then leave the ledger by themselves at
        `now + p.ttft_s`, when its prefill is predicted done (the returned ticket's `due_at`)."""
        if now is not None:
            p = replace(p, due_at=now + p.ttft_s)
        self.model(p.replica, p.pool).dispatched(p.uncached_tokens, p.at, p.due_at)
        credits = self._credits
        took = credits.take()
        joiners = self._joiners.get(p.replica)
        if joiners is None:
            joiners = self._joiners[p.replica] = Joiners()
        joiners.dispatched(p.ident, p.uncached_tokens, p.owed, p.batch_kv_tokens > 0, took, credits.newest)
        if p.prompt_tokens > 0 and p.at is not None:
            ledger = self._kv.get(p.replica)
            if ledger is None:
                ledger = self._kv[p.replica] = KvLedger(self.block_tokens)
            ledger.add(p.ident, p.prompt_tokens, p.output_tokens, p.at + p.ttft_s, p.prefix_keys,
                       p.uncached_tokens)  # fmt: skip
        return p

    def started(self, p: Prediction, at: float) -> None:
        """Ticket `p`'s request's first token came at `at` (the caller's clock, as `now`): it is
        running, and the KV ledger dates its end from `at`."""
        ledger = self._kv.get(p.replica)
        if ledger is not None:
            ledger.first_token(p.ident, at)

    def ended(self, p: Prediction, now: float | None = None) -> None:
        """Ticket `p`'s request ended, whatever the outcome: its KV blocks are free (it leaves the
        replica's KV ledger). With `now` (the caller's clock, as for `predict`), a follow-up request
        may come from its client within one unloaded decode step of the replica (`follow_ups`).
        Call once per `dispatched`, after `prefilled`."""
        ledger = self._kv.get(p.replica)
        if ledger is not None:
            ledger.remove(p.ident)
        joiners = self._joiners.get(p.replica)
        if joiners is not None:
            joiners.ended(p.ident)
        if now is not None:
            model = self._models.get(p.replica)
            self._credits.ended(now + (model.tpot.a if model is not None else 0.0))

    def group_in_flight(self, replica: str, prefix_keys: tuple[int, ...], min_shared_keys: int) -> int:
        """Requests in flight on `replica` of the prefix group of a prompt with `prefix_keys`, counted
        when the prompt shares at least `min_shared_keys` leading keys with the group
        (`KvLedger.group_in_flight`)."""
        ledger = self._kv.get(replica)
        return ledger.group_in_flight(prefix_keys, min_shared_keys) if ledger is not None else 0

    def kv_in_flight(self, replica: str) -> int:
        """Requests the KV ledger holds on `replica` (dispatched, not ended)."""
        ledger = self._kv.get(replica)
        return len(ledger) if ledger is not None else 0

    def prefilled(self, p: Prediction) -> None:
        """Ticket `p`'s request got its first token, or ended without one: no longer ahead of others
        (a ticket with `due_at` may have left already). Call exactly once per `dispatched`."""
        model = self._models.get(p.replica)
        if model is not None:
            model.prefilled(p.uncached_tokens, p.at, p.due_at)

    def observe_ttft(self, p: Prediction, ttft_s: float) -> float | None:
        """Ticket `p`'s request's first token came `ttft_s` after dispatch. Calibrates when `p`'s inputs
        were fresh. Returns |predicted - actual| / actual (None for a non-positive `ttft_s`)."""
        if not ttft_s > 0:
            return None
        model = self._models.get(p.replica)
        joiners = self._joiners.get(p.replica)
        joined = joiners.seen.pop(p.ident, 0) if joiners is not None else 0
        if model is not None and p.fresh:
            model.observe_ttft(p.ahead_tokens + joined, p.uncached_tokens, p.wait_s, ttft_s)
        return abs(p.ttft_s - ttft_s) / ttft_s

    def step_seen(self, replica: str, at: float) -> None:
        """A chunk of one of kvgate's streams on `replica` came at `at` (the caller's clock, as `now`):
        a step of that replica ended then, which dates the next one (chunks of one step, one per
        stream, count once: `ReplicaLatencyModel.step_seen`) and gave each running request of the KV
        ledger one more token (their ends: `KvLedger.step_seen`)."""
        model = self._models.get(replica)
        if model is not None and model.step_seen(at):
            joiners = self._joiners.get(replica)
            if joiners is not None:
                joiners.step_began()
            ledger = self._kv.get(replica)
            if ledger is not None:
                ledger.step_seen(at)

    def observe_tpot(self, p: Prediction, tpot_s: float) -> bool:
        """Ticket `p`'s request's mean time between output tokens was `tpot_s`. True when calibrated."""
        model = self._models.get(p.replica)
        if model is None or not p.fresh or not tpot_s > 0:
            return False
        return model.observe_tpot(p.batch_kv_tokens, tpot_s)
