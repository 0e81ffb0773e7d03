"""The predicted-latency model's live side: each dispatch's ticket, what it got, and the metrics.

The models themselves are pure (`policies.latency`, owned by the `Router` as `router.latency`, which
is what scheduling reads). This glues them to the request path (gateway/proxy.py):

- `dispatch` at each attempt: the prediction for the replica tried, from the inputs of that moment
  (the fleet snapshot's in-flight counts and last scrape, the prefix the index believed it held);
  its uncached tokens join the replica's pending-prefill ledger (a non-streaming request's, with a
  due time: the dispatch plus its predicted TTFT);
- `first_token` when the first chunk of a stream is relayed: the ledger lets the tokens go, the
  TTFT (attempt start to first chunk) calibrates the replica's model when the prediction's inputs
  were fresh, and |predicted - actual| / actual goes to `kvgate_ttft_prediction_error_ratio`;
- `ended` after the attempt, whatever happened: the ledger lets go of a request that never had a
  first token, the KV-block ledger (`policies.latency.kv_admission`) lets go of every request (its
  blocks are free), and a stream's mean time per output token calibrates the decode model.

A non-streaming answer has no first-token time: it leaves the ledger when its prefill is predicted
done (or when it ends, if sooner), so the latency gate does not count it as work ahead of the next
request for its whole decode, and it calibrates nothing. The DES mode (loadtests/des/) calls the
same three with virtual times.
"""

from __future__ import annotations

from typing import Any

from policies.latency.estimator import LatencyEstimator, Prediction

ERROR_BUCKETS = (0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 5.0)


class LatencyStore:
    """One per Router (one event loop). `metrics`: a `GatewayMetrics` (its error histogram), or None."""

    def __init__(self, estimator: LatencyEstimator, metrics: Any = None) -> None:
        self.estimator = estimator
        self._metrics = metrics
        self._children: dict[tuple[str, str], Any] = {}

    def dispatch(self, ticket: Prediction, now: float | None = None) -> Prediction:
        """Ticket `ticket` was sent; returns the ticket to keep. `now` (the dispatch's time, the
        estimator's clock) when the answer will not stream: no first token will be reported."""
        return self.estimator.dispatched(ticket, now)

    def first_token(self, ticket: Prediction, ttft_s: float) -> float | None:
        est = self.estimator
        est.prefilled(ticket)
        if ticket.at is not None:
            est.started(ticket, ticket.at + ttft_s)
        error = est.observe_ttft(ticket, ttft_s)
        if error is not None and self._metrics is not None:
            key = (ticket.replica, ticket.pool)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._metrics.ttft_prediction_error.labels(*key)
            child.observe(error)
        return error

    def ended(
        self, ticket: Prediction, had_first_token: bool, tpot_s: float | None = None, now: float | None = None
    ) -> None:
        """The attempt of `ticket` ended, whatever happened: it leaves the pending-prefill ledger if
        it never had a first token, and the KV-block ledger in any case (its blocks are free). `now`
        (the estimator's clock) dates the end of an answer that had a first token: a closed-loop
        client's next request may follow. An attempt that failed before its first token is retried
        or refused by kvgate; no client answered, so no follow-up is expected of it."""
        est = self.estimator
        if not had_first_token:
            est.prefilled(ticket)
            est.ended(ticket)
            return
        if tpot_s is not None:
            est.observe_tpot(ticket, tpot_s)
        est.ended(ticket, now)

    def forget(self, replica: str) -> None:
        """The replica left or restarted: its model and its error series go."""
        self.estimator.forget(replica)
        if self._metrics is None:
            return
        for key in [k for k in self._children if k[0] == replica]:
            del self._children[key]
            self._metrics.ttft_prediction_error.remove(*key)
