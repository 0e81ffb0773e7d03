"""Named profile specs that ship with kvgate; the config may add profiles or override these by name.

- `default`: kvgate's profile. Hard filters (in-service, healthy, serves-model, serves-adapter), soft
  filters (slow-start, fresh, load-guard), and the scorers the benchmark kept: prefix affinity, queue
  depth, LoRA locality, session affinity (kv-headroom and kv-full are available to custom profiles;
  the benchmark found them harmful with shared prefixes, see the comment on the spec); the
  `near-best` picker, so several gateway processes do not herd or scatter prefixes.
- `kv-fit`: `default` plus the `kv-fit` scorer (placement that respects each replica's KV capacity).
- `weighted`: an exact copy of `default` (the weighted sum of unit-less scores), so it stays
  selectable by name whatever `default` becomes.
- `predicted-latency`: the membership filters and `fresh`, then the replica with the least predicted
  time to first token (`policies.latency`: uncached prefill ahead of the request and its own, at
  each replica's calibrated rate), which counts prefix affinity as the tokens it saves; small
  prefix-affinity and LoRA-locality terms break near-ties towards the held prefix (its next turn's
  saving) and a resident adapter; `prefix-spread` sends a hot prefix group that crowds its replica
  to another (the cost is one request's, and never pays for a second copy on its own).
- `round-robin`, `least-loaded` (queue depth only), `prefix-only` and `random`: the baselines the
  benchmark compares against. They keep only the membership filters (the hard ones and slow-start),
  so they differ from `default` in how they choose, not in whether they can serve.

Every built-in starts with `in-service`: a replica that is not ready or is draining must get no new
request whichever profile is active. `slow-start` only acts on replicas that are ramping up, and
`in-flight-cap` on replicas at flow control's per-replica cap (flow control admits by the pool's room,
scheduling must then not pile it onto one replica). `latency-knee` (soft, only with predicted
admission on) keeps the replicas where the request's predicted TTFT is within the latency gate's
knee: the gate admitted it because one was, and the scorers must not send it to another that is
busy with a long prefill.
"""

from __future__ import annotations

import copy
from typing import Any

from policies.scheduling.profile import SchedulingProfile
from policies.scheduling.registry import build_profile

_BASE_FILTERS: tuple[dict[str, Any], ...] = (
    {"type": "in-service"},
    {"type": "healthy"},
    {"type": "serves-model"},
    {"type": "serves-adapter"},
    {"type": "slow-start"},  # soft, and a no-op unless a replica is ramping up (discovery.slow_start_s)
    {"type": "in-flight-cap"},  # soft: a replica at flow control's per-replica cap waits its turn
    # soft, and a no-op unless predicted admission is on: the request goes to a replica where its
    # predicted TTFT is within the gate's knee, if any (docs/benchmarks.md, "Third round").
    {"type": "latency-knee"},
)

_SPECS: dict[str, dict[str, Any]] = {
    "default": {
        # Chosen by measurement (docs/benchmarks.md, "Choosing the default weights"; `kvgate bench
        # --preset weights`, 3 seeds): against the provisional prefix 3 / queue 2 / kv-headroom 1 with
        # kv-full at 0.98 and load-guard 8 requests / 50%, on a shared-prefix working set of 3x one
        # replica's KV over 4 replicas, goodput 37.0 vs 16.9 req/s at 64 streams (TTFT p90 0.80 vs
        # 1.38 s, hit rate 85% vs 66%) and 31.1 vs 28.3 at 32; on two hot prefixes equal at 64
        # streams and 13% less goodput at 32 (the price of the wider guard).
        # - load-guard 16 requests / 100%: the old 8 / 50% pulled a group's requests off its replica
        #   whenever ordinary popularity noise put it 8 ahead, and each such miss prefilled a 4k-token
        #   prompt and took KV from others. The guard is also what keeps a hot prefix from herding.
        # - no kv-headroom scorer and no kv-full filter: with prefixes shared, a replica's KV usage is
        #   mostly the prefixes its running requests share, so "free KV" pointed requests away from
        #   their cache (to replicas that then had to prefill and hold a second copy): keeping them
        #   with the wider guard gave 29.3 req/s at 64 streams, unstable across seeds (22.5-36.1).
        #   Congestion still counts through queue-depth (waiting + in flight) and the guard. Both
        #   plugins remain for custom profiles.
        # Prefix 3 against queue 2: a full prefix hit outweighs the whole queue range among the
        # replicas the guard lets through, while a half hit does not beat the least-loaded replica.
        "filters": [
            *_BASE_FILTERS,
            {"type": "fresh"},
            {"type": "load-guard", "params": {"abs_slack": 16.0, "rel_slack": 1.0}},
        ],
        "scorers": [
            {"type": "prefix-affinity", "weight": 3.0},
            {"type": "queue-depth", "weight": 2.0},
            {"type": "lora-locality", "weight": 1.0},
            {"type": "session-affinity", "weight": 1.0},
        ],
        # near-best, not max-score: several gateway processes each see the same scrapes and only their
        # own dispatches and prefix index. With max-score each one placed a new prefix on a replica of
        # its own and they piled onto the same best replica between scrapes; near-best draws the winner
        # among candidates within 0.25 of the best by a rendezvous hash of the prompt's first 4 index
        # blocks, so the processes agree on a prefix's replica without sharing state (docs/benchmarks.md,
        # "Hit rate and goodput vs number of gateways"). 0.25 is below the smallest step of these
        # scorers (an active adapter over a free slot: 0.5), so only near-ties are drawn.
        "picker": {"type": "near-best", "params": {"margin": 0.25, "hash_blocks": 4}},
    },
    "predicted-latency": {
        # No load-guard and no queue-depth: the model prices the queue in seconds. `fresh` stays soft
        # as in `default` (a stale replica's queue is only known from kvgate's own ledger).
        # `prefix-spread`: the cost is one request's, so a hot prefix's requests all stayed where it
        # is held while other replicas idled (two hot prefixes over 4 replicas at 8 streams per
        # replica: 10-19% less goodput than `default`); a group crowding its replica now warms a copy
        # elsewhere. No change on conversations or on many groups (docs/benchmarks.md, "Hot prefixes").
        "filters": [*_BASE_FILTERS, {"type": "fresh"}, {"type": "prefix-spread"}],
        "scorers": [
            # work_weight 1: the cost of a choice is its TTFT plus the seconds of prefill it adds
            # there (what later requests wait for); a conversation moves only when its replica is
            # behind by more than re-prefilling it elsewhere costs (docs/benchmarks.md, issue #11).
            # batch_weight 0.5: plus half the seconds its prefill holds up the requests decoding
            # there (x their number), so batches stay even and a busy replica keeps what it holds;
            # 0.5 kept more of the oracle's hits than 1 or 2 at the same goodput (same section).
            # kv_weight 1: plus the predicted wait for free KV blocks there, so a replica filling
            # with requests that wait for blocks stops taking more (same section).
            {
                "type": "predicted-latency",
                "weight": 1.0,
                "params": {"work_weight": 1.0, "batch_weight": 0.5, "kv_weight": 1.0},
            },
            # A held prefix also saves the NEXT turn's prefill, which this request's TTFT does not
            # count: 0.1 x the matched share keeps a conversation where its TTFT is within a few
            # percent of the best (near-best's draw among near-ties moved them otherwise).
            {"type": "prefix-affinity", "weight": 0.1},
            {"type": "lora-locality", "weight": 0.1},
        ],
        # near-best at 5% of the best TTFT: near-ties of a new prompt go where a rendezvous hash of
        # its first blocks says, so several gateway processes agree on a new prefix's replica.
        "picker": {"type": "near-best", "params": {"margin": 0.05, "hash_blocks": 4}},
    },
    "round-robin": {
        "filters": [*_BASE_FILTERS],
        "scorers": [],
        "picker": {"type": "round-robin"},
    },
    "least-loaded": {
        "filters": [*_BASE_FILTERS],
        "scorers": [{"type": "queue-depth", "weight": 1.0}],
        "picker": {"type": "max-score"},
    },
    "prefix-only": {
        "filters": [*_BASE_FILTERS],
        "scorers": [{"type": "prefix-affinity", "weight": 1.0}],
        "picker": {"type": "max-score"},
    },
    "random": {
        "filters": [*_BASE_FILTERS],
        "scorers": [],
        "picker": {"type": "random"},
    },
}

_SPECS["weighted"] = copy.deepcopy(_SPECS["default"])  # today's default, by a name that stays
# `default` plus placement that respects KV capacity (issue #11, docs/benchmarks.md "Placement that
# respects KV capacity"): a new prefix group goes to a replica whose KV fits it next to the groups it
# already holds, and a group leaves a home that cannot hold it. Weight 5: a fit outweighs the whole
# queue-depth range (2), and a move outweighs a held prefix (3 x its matched share).
_SPECS["kv-fit"] = copy.deepcopy(_SPECS["default"])
_SPECS["kv-fit"]["scorers"].append({"type": "kv-fit", "weight": 5.0})

BUILTIN_PROFILE_NAMES: tuple[str, ...] = tuple(_SPECS)


def builtin_profile_spec(name: str) -> dict[str, Any]:
    """A fresh copy of the named built-in spec (plain data, safe to modify); KeyError lists the names."""
    try:
        return copy.deepcopy(_SPECS[name])
    except KeyError:
        raise KeyError(f"unknown built-in profile {name!r}; known: {', '.join(_SPECS)}") from None


def build_builtin_profile(name: str) -> SchedulingProfile:
    """`build_profile(builtin_profile_spec(name))`."""
    return build_profile(builtin_profile_spec(name))
