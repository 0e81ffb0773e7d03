"""Predicted latency: a per-replica TTFT/TPOT model with napkin priors, calibrated online (issue #11).

- `prior`: the roofline numbers a replica is assumed to have before kvgate has seen it answer.
- `rls`: a two-coefficient recursive least squares fit with forgetting and bounds.
- `replica_model`: one replica's model: TTFT = fixed + seconds per uncached prefill token x (work ahead
  + own uncached prompt); TPOT = decode step + seconds per KV token read x batch context.
- `kv_admission`: the wait for free KV blocks before a replica admits a request, from kvgate's
  requests in flight there (their prompts, output caps, first tokens and prefix groups) and the
  replica's KV capacity.
- `estimator`: every replica's model, the pending-prefill ledger of kvgate's own dispatches, the KV
  ledger of its requests in flight, and the tickets that carry a dispatch's prediction inputs to its
  observation.

Pure: no I/O, no clock of its own (callers pass `now`).
"""

from policies.latency.estimator import LatencyEstimator, Prediction
from policies.latency.prior import LatencyPrior
from policies.latency.replica_model import ReplicaLatencyModel

__all__ = ["LatencyEstimator", "LatencyPrior", "Prediction", "ReplicaLatencyModel"]
