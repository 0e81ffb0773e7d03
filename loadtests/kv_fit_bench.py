"""Placement against KV capacity (issue #11): prefix groups whose working set is a fraction of the fleet's KV.

For each fleet size, working-set fraction, seed and policy, one discrete-event run (`loadtests.des`,
the gateway's own `Router` and profiles) of a shared-prefix workload on small simulated replicas
(`--block-size 32 --kv-blocks 64 --max-num-seqs 16`, 1,024-token context: the issue's case), closed
loop at 2 clients per replica. Reported per run: the fleet's prefix hit rate, the workload's oracle
(every request but its group's first hits its group's whole shared prefix, in full engine blocks), and
the groups each replica is home to (the replica that served most of the group's requests in the run's
second half) against how many groups its KV fits (replica KV tokens / one group's prefix tokens), and
the second-half requests served away from their group's home.

Policies: the gateway's scheduling profiles (built-in, or from `--profiles FILE`), and two bench-only
ones (`loadtests.placement_oracle`): `placement-oracle`, the balanced static partition of the groups
(the placement oracle: each run's hit rate is also reported as a share of its hit rate in the same
seed), and `static-W:W...`, a static partition weighted per replica (e.g. `static-2:1`: 8/4 of 12).

    python -m loadtests.kv_fit_bench --replicas 2,4 --fractions 0.5,0.75,0.9 --seeds 0,1,2,3,4 \\
        --policies placement-oracle,default,kv-fit

Bounded: a few seconds of CPU per run. `--cost` instead times the ledger and the scorer per request.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loadtests.des.config import DesConfig
from loadtests.des.fleet import FleetSpec
from loadtests.des.prompts import PromptTokenizer
from loadtests.des.simulation import Simulation
from loadtests.placement_oracle import ORACLE_POLICY, install
from loadtests.runner import LoadConfig
from loadtests.workloads.shared_prefix import SharedPrefixWorkload
from loadtests.workloads.spec import RequestSpec
from simulator.engine import EngineConfig

BLOCK_SIZE = 32
KV_BLOCKS = 64
MAX_NUM_SEQS = 16
MAX_MODEL_LEN = 1024
SYSTEM_PROMPT_TOKENS = 256
QUESTION_TOKENS = 64
OUTPUT_TOKENS = 32
PROMPTS_PER_GROUP = 40
CLIENTS_PER_REPLICA = 2


@dataclass(frozen=True, slots=True)
class Outcome:
    policy: str
    replicas: int
    fraction: float
    seed: int
    groups: int
    hit_rate: float
    oracle: float
    groups_per_replica: tuple[int, ...]
    fits: int
    goodput_rps: float
    ttft_p90_s: float | None
    off_home: int = 0  # second-half requests served away from their group's home
    held: int | None = None  # requests held at the gateway (None: flow control not modelled)

    @property
    def of_oracle(self) -> float:
        return self.hit_rate / self.oracle if self.oracle else 0.0


def groups_for(replicas: int, fraction: float) -> int:
    """Groups whose system prompts together are `fraction` of the fleet's KV tokens."""
    return max(1, round(fraction * replicas * KV_BLOCKS * BLOCK_SIZE / SYSTEM_PROMPT_TOKENS))


def _shared_tokens(tok: PromptTokenizer, specs: Sequence[RequestSpec]) -> int:
    """Leading tokens a group's prompts share, cut to full engine blocks (what a cache can hit)."""
    a, b = (tok.chat_ids(s.body["messages"]) for s in specs[:2])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n // BLOCK_SIZE * BLOCK_SIZE


def run_one(
    policy: str,
    replicas: int,
    fraction: float,
    seed: int,
    question_tokens: int = QUESTION_TOKENS,
    output_tokens: int = OUTPUT_TOKENS,
    profiles: Mapping[str, Any] | None = None,
    flow_control: bool = False,
) -> Outcome:
    """One run. `profiles`: extra scheduling profiles (name -> spec, as under `scheduling.profiles`)
    that `policy` may name; `flow_control`: the gateway admits through its queue and latency gate,
    as kvgate ships (`DesConfig.flow_control`)."""
    groups = groups_for(replicas, fraction)
    engine = EngineConfig(block_size=BLOCK_SIZE, num_gpu_blocks=KV_BLOCKS, max_num_seqs=MAX_NUM_SEQS,
                          max_model_len=MAX_MODEL_LEN)  # fmt: skip
    fleet = FleetSpec(replicas=replicas, profile="tiny", engine=engine)
    workload = SharedPrefixWorkload(
        groups=groups, prompts_per_group=PROMPTS_PER_GROUP, system_prompt_tokens=SYSTEM_PROMPT_TOKENS,
        question_tokens=question_tokens, output_tokens=output_tokens, model=fleet.model_name, seed=seed,
    )  # fmt: skip
    specs = list(workload.requests())
    tok = PromptTokenizer()
    by_group: dict[str, list[RequestSpec]] = defaultdict(list)
    for s in specs:
        by_group[str(s.group)].append(s)
    shared = {g: _shared_tokens(tok, ss) for g, ss in by_group.items()}
    prompt_tokens = sum(len(tok.chat_ids(s.body["messages"])) for s in specs)
    oracle_hits = sum(shared[g] * (len(ss) - 1) for g, ss in by_group.items())

    static = _static_weights(policy)
    gateway = {"scheduling": {"profiles": dict(profiles)}} if profiles else None
    sim = Simulation(DesConfig(fleet, policy="default" if static is not None else policy, seed=seed,
                               gateway=gateway, flow_control=flow_control))  # fmt: skip
    partition = install(sim, static) if static is not None else None
    load = LoadConfig(concurrency=CLIENTS_PER_REPLICA * replicas, max_requests=len(specs),
                      duration_s=float("inf"), seed=seed)  # fmt: skip
    result = sim.run(specs, load)
    if partition is not None and len(partition.assignment) != groups:
        raise RuntimeError(f"the oracle saw {len(partition.assignment)} groups, the workload has {groups}")
    record = result.to_record(workload=workload.name, slo=None)
    order = {s.request_id: i for i, s in enumerate(specs)}
    half = len(specs) // 2
    served: dict[str, Counter[str]] = defaultdict(Counter)
    for t in sim.traces:
        if t.group is not None and t.replica is not None and order[t.request_id] >= half:
            served[t.group][t.replica] += 1
    homes = Counter(c.most_common(1)[0][0] for c in served.values())
    off_home = sum(c.total() - c.most_common(1)[0][1] for c in served.values())
    per_replica = tuple(sorted((homes.get(n, 0) for n in fleet.names), reverse=True))
    prefix = max(shared.values())
    return Outcome(
        policy=policy, replicas=replicas, fraction=fraction, seed=seed, groups=groups,
        hit_rate=float(record["prefix_hit_rate"] or 0.0), oracle=oracle_hits / prompt_tokens,
        groups_per_replica=per_replica, fits=KV_BLOCKS * BLOCK_SIZE // max(1, prefix),
        goodput_rps=float(record["goodput_rps"] or 0.0), ttft_p90_s=record["ttft_p90_s"], off_home=off_home,
        held=record["des"]["gateway_wait_s"]["held"] if flow_control else None,
    )  # fmt: skip


def _second_half(r: Outcome) -> int:
    """The second half of a run's requests (where homes and off-home requests are counted)."""
    return r.groups * PROMPTS_PER_GROUP - r.groups * PROMPTS_PER_GROUP // 2


def _static_weights(policy: str) -> tuple[float, ...] | None:
    """The partition a bench-only static policy names (`loadtests.placement_oracle`): () for
    `placement-oracle` (round robin), the weights of `static-2:1:1...`; None for a gateway profile."""
    if policy == ORACLE_POLICY:
        return ()
    if policy.startswith("static-"):
        return tuple(float(w) for w in policy.removeprefix("static-").split(":"))
    return None


def decision_cost(replicas: int = 16, groups: int = 2000, requests: int = 5000, seed: int = 0) -> str:
    """Median and p99 of the ledger's view + the scorer + the ledger's update per request (no index,
    no profile), over `groups` confirmed groups of 129-block prompts spread over `replicas`."""
    import random
    import time

    from policies.kv_fit import GroupLedger
    from policies.scheduling.context import SchedulingContext
    from policies.scheduling.scorers.kv_fit import KvFitScorer
    from policies.types import ReplicaState, RequestInfo

    names = [f"r{i}" for i in range(replicas)]
    candidates = [ReplicaState(name=n, url="", pool="m", num_gpu_blocks=25_000, block_size=16) for n in names]
    capacity = {n: 25_000 * 16 / 64 for n in names}
    ledger, scorer, rng = GroupLedger(), KvFitScorer(), random.Random(seed)

    def prompt(g: int) -> tuple[int, ...]:
        return (*(g * 1000 + i for i in range(128)), rng.getrandbits(60))

    now = 0.0
    for g in range(groups):
        for _ in range(2):
            now += 0.001
            ledger.record(prompt(g), names[g % replicas], 0, now)
    times = []
    for _ in range(requests):
        g = rng.randrange(groups)
        keys, home = prompt(g), names[g % replicas]
        now += 0.001
        started = time.perf_counter_ns()
        view = ledger.fit_view(keys, capacity, now)
        info = RequestInfo(
            model="m", base_model="m", adapter=None, prompt_tokens=1, max_tokens=1, prefix_keys=keys
        )
        ctx = SchedulingContext(
            request=info, now=now, prefix_match={home: 128}, prefix_blocks=len(keys), kv_fit=view
        )
        scorer.score(ctx, candidates)
        ledger.record(keys, home, 128, now)
        times.append(time.perf_counter_ns() - started)
    times.sort()
    median, p99 = times[len(times) // 2] / 1e3, times[int(len(times) * 0.99)] / 1e3
    return (
        f"{replicas} replicas, {groups} groups, 129-block prompts: median {median:.1f} us, "
        f"p99 {p99:.1f} us (view + score + update)"
    )


def _summary(rows: Sequence[Outcome]) -> str:
    """One line per fleet size, working set and policy. With `placement-oracle` among the policies,
    each run's hit rate is also divided by the placement oracle's in the same seed (same workload)."""
    placed = {(r.replicas, r.fraction, r.seed): r.hit_rate for r in rows if r.policy == ORACLE_POLICY}
    lines = ["| replicas | working set | groups | policy | of oracle: worst / median | of placement oracle: "
             "worst / median | hit rate worst (oracle) | max groups on a replica: worst / median (fits) | "
             "splits |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    keys = sorted({(r.replicas, r.fraction, r.policy) for r in rows}, key=lambda k: (k[0], k[1]))
    policies = list(dict.fromkeys(r.policy for r in rows))
    keys.sort(key=lambda k: (k[0], k[1], policies.index(k[2])))
    for replicas, fraction, policy in keys:
        runs = [r for r in rows if (r.replicas, r.fraction, r.policy) == (replicas, fraction, policy)]
        ratios = [r.of_oracle for r in runs]
        worst = min(runs, key=lambda r: r.of_oracle)
        most = [max(r.groups_per_replica) for r in runs]
        splits = " ".join("/".join(map(str, r.groups_per_replica)) for r in runs)
        shares = [r.hit_rate / placed[k] for r in runs if placed.get(k := (r.replicas, r.fraction, r.seed))]
        of_placed = f"{min(shares):.1%} / {statistics.median(shares):.1%}" if shares else "-"
        lines.append(
            f"| {replicas} | {fraction:g}x | {runs[0].groups} | {policy} | {min(ratios):.1%} / "
            f"{statistics.median(ratios):.1%} | {of_placed} | {worst.hit_rate:.1%} ({worst.oracle:.1%}) | "
            f"{max(most)} / {statistics.median(most):g} ({runs[0].fits}) | {splits} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.kv_fit_bench", description=__doc__.splitlines()[0])
    p.add_argument("--replicas", default="2,4")
    p.add_argument("--fractions", default="0.5,0.75,0.9")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--policies", default="default,kv-fit")
    p.add_argument("--cost", action="store_true", help="only time the ledger and scorer per request")
    p.add_argument("--question-tokens", type=int, default=QUESTION_TOKENS)
    p.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS)
    p.add_argument("--profiles", type=Path, default=None,
                   help="YAML file of extra scheduling profiles (name: {filters, scorers, picker}), as under "
                   "scheduling.profiles in the config")  # fmt: skip
    p.add_argument("--flow-control", action="store_true",
                   help="admit through the gateway's queue and latency gate, as kvgate ships (des_cli "
                   "--flow-control); without it every request is routed on arrival")  # fmt: skip
    args = p.parse_args(argv)
    profiles = yaml.safe_load(args.profiles.read_text()) if args.profiles is not None else None
    if profiles is not None and not isinstance(profiles, dict):
        raise SystemExit(f"{args.profiles}: expected a mapping of profile name to profile")
    if args.cost:
        print(decision_cost(), flush=True)
        return 0
    rows: list[Outcome] = []
    for replicas in (int(v) for v in args.replicas.split(",")):
        for fraction in (float(v) for v in args.fractions.split(",")):
            for seed in (int(v) for v in args.seeds.split(",")):
                for policy in args.policies.split(","):
                    r = run_one(
                        policy,
                        replicas,
                        fraction,
                        seed,
                        args.question_tokens,
                        args.output_tokens,
                        profiles,
                        flow_control=args.flow_control,
                    )
                    rows.append(r)
                    print(f"R={replicas} ws={fraction:g} seed={seed} {policy}: hit {r.hit_rate:.3f} "
                          f"oracle {r.oracle:.3f} ({r.of_oracle:.1%}) groups/replica "
                          f"{'/'.join(map(str, r.groups_per_replica))} (fits {r.fits}) "
                          f"off home {r.off_home}/{_second_half(r)} goodput {r.goodput_rps:.1f} req/s"
                          + ("" if r.held is None else f", held at kvgate {r.held}"),
                          flush=True)  # fmt: skip
    print(_summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
