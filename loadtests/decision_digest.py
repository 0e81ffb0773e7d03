"""A digest of many routing decisions: equal on two commits means a speed-up changed no decision.

    python -m loadtests.decision_digest [--policy default predicted-latency] [--decisions 600]

Runs `decision_bench`'s cells (warm index, the same request mix; 1k tokens / 4 replicas, 8k / 16,
32k / 64 by default) through the whole decision as the gateway makes it (canonical bytes, block keys,
index match, `RequestInfo`, `SchedulingContext`, `schedule`) and feeds every intermediate result into
one SHA-256 per policy and cell: the canonical bytes, the keys, the ranked replica names, the totals and
the dropped replicas. The index records every winner and every third winner's prediction is dispatched
into the latency ledger, so later decisions see what earlier ones did, as in a gateway. Run it on the
commit before a change and on the change (check out each, or point PYTHONPATH at each tree): the two
outputs must be identical.
"""

from __future__ import annotations

import argparse
import hashlib
import random
from collections.abc import Sequence

import orjson

from gateway.config_slo import DEFAULT_KNEE_FACTOR
from loadtests.decision_bench import (
    BLOCK_BYTES,
    INDEX_BLOCK_TOKENS,
    MODEL,
    NOW,
    decision_context,
    snapshots,
    warm_fleet,
)
from policies.latency.estimator import LatencyEstimator
from policies.prefix import byte_block_keys, seed_for
from policies.prompt_text import canonical_chat_bytes
from policies.scheduling.builtin_profiles import build_builtin_profile

CELLS = ((1024, 4), (8192, 16), (32768, 64))


def digest(
    policy: str, tokens: int, replicas: int, decisions: int, seed: int,
    knee: float | None = DEFAULT_KNEE_FACTOR,
) -> str:  # fmt: skip
    """SHA-256 (hex) of `decisions` decisions of one cell under the built-in profile `policy`, the
    latency gate's knee `knee` in the context (the default, as a gateway runs; None: the gate off)."""
    rng = random.Random(seed * 1_000_003 + tokens * 101 + replicas)
    index, names, mix = warm_fleet(rng, tokens, replicas, requests=60)
    pools = snapshots(rng, names, 8)
    profile = build_builtin_profile(policy)
    latency = LatencyEstimator(INDEX_BLOCK_TOKENS)
    pick_rng = random.Random(seed)
    seed_key = seed_for(MODEL, None)
    h = hashlib.sha256()
    for n in range(decisions):
        messages = orjson.loads(orjson.dumps(mix[n % len(mix)]))  # parsed afresh, as from a body
        data = canonical_chat_bytes(messages)
        keys = byte_block_keys(data, BLOCK_BYTES, seed_key)
        ctx = decision_context(data, keys, index.match(keys, names), n, latency, knee)
        info = ctx.request
        decision = profile.schedule(ctx, pools[n % len(pools)], pick_rng)
        ranked = [r.name for r in decision.ranked]
        h.update(repr((data, keys, ranked, decision.totals, sorted(decision.dropped.items()))).encode())
        winner = decision.replica
        if winner is not None:
            index.record(winner.name, keys)
            if n % 3 == 0:
                latency.dispatched(latency.predict(winner, info.prompt_tokens, NOW, 1.0))
    return h.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.decision_digest", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--policy", nargs="+", default=["default", "predicted-latency"])
    parser.add_argument("--decisions", type=int, default=600, help="decisions per cell")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--knee-factor", type=float, default=DEFAULT_KNEE_FACTOR,
                        help="the latency gate's knee in the context (0 = gate off)")  # fmt: skip
    args = parser.parse_args(argv)
    for policy in args.policy:
        for tokens, replicas in CELLS:
            found = digest(policy, tokens, replicas, args.decisions, args.seed, args.knee_factor or None)
            print(f"{policy} {tokens}/{replicas}: {found}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
