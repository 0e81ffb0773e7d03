"""`python -m loadtests.des_cli`: what-if runs of the benchmark on a simulated fleet, in virtual time.

The same workload generators, load semantics and kvgate routing as `kvgate bench`, over the
simulator's engine model with no HTTP and no wall clock (`loadtests.des`), so fleets and request
counts far beyond this machine fit: e.g. 256 replicas and 10^5 requests::

    python -m loadtests.des_cli --replicas 256 --profile llama-3-8b-h100 --workload shared-prefix \\
        --system-prompt-tokens 6000 --question-tokens 256 --output-tokens 128 \\
        --requests 100000 --concurrency 2048 --policy default,round-robin --out results/des-256

Per policy, one simulated fleet and gateway take the warm-up (`--warmup-requests`, unmeasured) and
then each load point in turn, each point `--requests` requests: the next slice of one seeded request
stream, the same slices for every policy (as `kvgate bench` does). Every time and rate is in
simulated seconds. Writes `results.json` (the bench's schema; records add `driver: "des"` and a `des`
object: wall/CPU time, events, per-replica hit rates, ...), `summary.md` and the plots to `--out`,
and prints one line per run.

`--gateways N` puts N gateway processes in front of the fleet, each with its own prefix index,
in-flight ledger and scrapes (`loadtests.des.gateways`; `--spread`, `--scrape-delay`,
`--scrape-phases`, `--ledger`); each line then adds the fleet's in-flight skew p99 (herding).
`python -m loadtests.des_gateways` sweeps gateway counts with it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from loadtests.des import DesConfig, FleetSpec, Simulation
from loadtests.des.gateways import (
    DEFAULT_EVENT_LAG_S,
    INDEX_SOURCES,
    LEDGERS,
    SCRAPE_PHASES,
    SPREADS,
    GatewayViews,
)
from loadtests.des.outcome import DesResult
from loadtests.measures import RequestTrace
from loadtests.report import write_report
from loadtests.results import make_meta, write_results
from loadtests.runner import LoadConfig
from loadtests.slo import Slo, parse_slo
from loadtests.workload_factory import WorkloadPlan, build_workload
from loadtests.workloads import (
    WORKLOAD_TYPES,
    LoraMixWorkload,
    MultiTurnWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
)
from loadtests.workloads.spec import RequestSpec
from simulator.engine import EngineConfig

INF = float("inf")
SHARED_PREFIX, MULTI_TURN, RANDOM = SharedPrefixWorkload.name, MultiTurnWorkload.name, RandomWorkload.name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.des_cli", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    fleet = p.add_argument_group("fleet")
    fleet.add_argument("--replicas", type=int, default=4)
    fleet.add_argument("--profile", default="llama-3-8b-h100", help="simulator profile (llama-3-8b-h100)")
    fleet.add_argument("--kv-blocks", type=int, default=None, help="KV blocks per replica (the profile's)")
    fleet.add_argument("--block-size", type=int, default=16)
    fleet.add_argument("--max-num-seqs", type=int, default=256)
    fleet.add_argument("--max-num-batched-tokens", type=int, default=8192)
    fleet.add_argument("--max-loras", type=int, default=None,
                       help="adapter slots per replica (default: 2 for lora-mix, else 0)")
    gw = p.add_argument_group("gateway")
    gw.add_argument("--policy", default="default",
                    help="scheduling profile(s), comma-separated: default, round-robin, least-loaded, "
                         "prefix-only, random, or one of --gateway-config's (default: default)")
    gw.add_argument("--gateway-config", type=Path, default=None,
                    help="a kvgate YAML config: its scheduling, fleet and models settings apply "
                         "(its replicas are replaced by the simulated ones)")
    gw.add_argument("--tokenizer", choices=("none", "sim"), default=None,
                    help="gateway prefix keys: none = byte blocks (the live default), sim = token blocks")
    gw.add_argument("--scrape-interval", type=float, default=None,
                    help="simulated seconds between scrapes of a replica (default: the config's, 0.2)")
    gw.add_argument("--gateway-overhead-ms", type=float, default=0.0,
                    help="fixed gateway delay per request, simulated ms (default 0; no network delay)")
    gw.add_argument("--gateways", type=int, default=1,
                    help="gateway processes in front of the fleet, each with its own prefix index, "
                         "in-flight ledger and scrapes (default 1)")
    gw.add_argument("--spread", choices=SPREADS, default="round-robin",
                    help="how requests reach the gateways (default round-robin)")
    gw.add_argument("--scrape-delay", type=float, default=0.0,
                    help="simulated seconds between a replica's numbers and the gateway seeing them")
    gw.add_argument("--scrape-phases", choices=SCRAPE_PHASES, default="independent",
                    help="each gateway scrapes at its own phases (independent) or all at once (aligned)")
    gw.add_argument("--index", choices=INDEX_SOURCES, default="approximate",
                    help="each gateway's prefix index: approximate (its own dispatches, the default) or "
                         "exact (every engine's KV events, --event-lag late; implies --tokenizer sim)")
    gw.add_argument("--event-lag", type=float, default=DEFAULT_EVENT_LAG_S,
                    help=f"simulated seconds from a step's end to its KV events reaching the gateways "
                         f"(exact index; default {DEFAULT_EVENT_LAG_S})")
    gw.add_argument("--ledger", choices=LEDGERS, default="local",
                    help="in-flight counts a gateway knows: its own (local, as live) or every gateway's "
                         "(shared: a what-if)")
    gw.add_argument("--flow-control", action="store_true",
                    help="admit requests through each gateway's admission queue and latency gate, as "
                         "configured (kvgate's defaults: on); without it every request is routed the "
                         "moment it arrives and the latency gate is off")
    wl = p.add_argument_group("workload (lengths in tokens)")
    wl.add_argument("--workload", choices=sorted(WORKLOAD_TYPES), default="shared-prefix")
    wl.add_argument("--system-prompt-tokens", type=int, default=2048)
    wl.add_argument("--question-tokens", type=int, default=256)
    wl.add_argument("--prompt-tokens", type=int, default=1024, help="random, lora-mix, noisy-neighbour")
    wl.add_argument("--user-tokens", type=int, default=256, help="multi-turn")
    wl.add_argument("--turns", type=int, default=4, help="multi-turn")
    wl.add_argument("--active-conversations", type=int, default=None,
                    help="multi-turn: conversations open at a time (default: all)")
    wl.add_argument("--session-header", nargs="?", const="x-session-id", default=None, metavar="NAME",
                    help="multi-turn: send each conversation's id in this header (default name: "
                         "x-session-id, the gateway's scheduling.session_header); default: no header")
    wl.add_argument("--output-tokens", type=int, default=64)
    wl.add_argument("--groups", type=int, default=None,
                    help="shared-prefix groups (default: sized to --target-multiple x one replica's KV)")
    wl.add_argument("--target-multiple", type=float, default=4.0)
    wl.add_argument("--adapters", type=int, default=8, help="lora-mix adapters")
    wl.add_argument("--zipf-s", type=float, default=1.0, help="lora-mix: adapter popularity exponent")
    wl.add_argument("--length-jitter", type=float, default=0.0,
                    help="random: prompt lengths uniform in (1 +- j) x --prompt-tokens (default 0)")
    wl.add_argument("--output-jitter", type=float, default=0.0,
                    help="random: output lengths uniform in (1 +- j) x --output-tokens (default 0)")
    load = p.add_argument_group("load (simulated seconds)")
    load.add_argument("--concurrency", default=None,
                      help="closed loop, comma-separated points (default 16 when no --rate)")
    load.add_argument("--rate", default=None,
                      help="open loop requests/s, comma-separated points (run after the closed-loop ones)")
    load.add_argument("--burstiness", type=float, default=1.0, help="open loop gamma shape (1 = Poisson)")
    load.add_argument("--requests", type=int, default=1000, help="requests per load point")
    load.add_argument("--warmup-requests", type=int, default=0, help="unmeasured requests before the points")
    load.add_argument("--warmup-s", type=float, default=0.0, help="unmeasured start of each point")
    load.add_argument("--duration", type=float, default=INF, help="bound of each point (default: none)")
    load.add_argument("--drain", type=float, default=60.0, help="then cut what still runs after this")
    load.add_argument("--timeout", type=float, default=300.0, help="request timeout")
    p.add_argument("--slo", default="ttft=1s,tpot=100ms", help="goodput thresholds (ttft=1s,tpot=100ms)")
    p.add_argument("--seed", type=int, default=0)
    chunks = p.add_mutually_exclusive_group()
    chunks.add_argument("--chunk-times", dest="chunk_times", action="store_true", default=None,
                        help="keep every token time in the traces (default: up to 20k requests)")
    chunks.add_argument("--no-chunk-times", dest="chunk_times", action="store_false")
    p.add_argument("--out", type=Path, default=None, help="results directory (default: print only)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _points(text: str | None, cast: type[float] | type[int]) -> list[float]:
    if text is None:
        return []
    return [float(cast(v)) for v in text.split(",") if v.strip()]


def workload_plan(args: argparse.Namespace) -> WorkloadPlan:
    """The `--workload` and its flags as a plan for the workload factory."""
    lengths: dict[str, Any] = {"output_tokens": args.output_tokens}
    if args.workload == SHARED_PREFIX:
        lengths |= {"system_prompt_tokens": args.system_prompt_tokens,
                    "question_tokens": args.question_tokens}  # fmt: skip
        lengths |= {"groups": args.groups} if args.groups else {"target_multiple": args.target_multiple}
    elif args.workload == MULTI_TURN:
        lengths |= {"turns": args.turns, "system_prompt_tokens": args.system_prompt_tokens,
                    "user_tokens": args.user_tokens, "active_conversations": args.active_conversations,
                    "session_header": args.session_header}  # fmt: skip
    else:  # random, lora-mix, noisy-neighbour
        lengths |= {"prompt_tokens": args.prompt_tokens}
    if args.workload == RANDOM:
        lengths |= {"length_jitter": args.length_jitter, "output_jitter": args.output_jitter}
    elif args.workload == LoraMixWorkload.name:
        lengths |= {"zipf_s": args.zipf_s}
    return WorkloadPlan(args.workload, lengths)


def fleet_spec(args: argparse.Namespace) -> FleetSpec:
    lora = args.workload == LoraMixWorkload.name
    max_loras = args.max_loras if args.max_loras is not None else (2 if lora else 0)
    engine = EngineConfig(block_size=args.block_size, num_gpu_blocks=args.kv_blocks,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_loras=max_loras)  # fmt: skip
    adapters = tuple(f"lora-{i}" for i in range(args.adapters)) if lora else ()
    return FleetSpec(replicas=args.replicas, profile=args.profile, engine=engine, adapters=adapters)


def _gateway_base(path: Path | None) -> Any:
    if path is None:
        return None
    from gateway.config_check import load_checked

    return load_checked(path)


def gateway_views(args: argparse.Namespace) -> GatewayViews:
    return GatewayViews(gateways=args.gateways, spread=args.spread, scrape_delay_s=args.scrape_delay,
                        scrape_phases=args.scrape_phases, ledger=args.ledger, index=args.index,
                        event_lag_s=args.event_lag)  # fmt: skip


def run(args: argparse.Namespace, command: str) -> list[dict[str, Any]]:
    fleet = fleet_spec(args)
    views = gateway_views(args)
    slo = parse_slo(args.slo) if args.slo else None
    closed = _points(args.concurrency, int) or ([] if args.rate else [16.0])
    rates = _points(args.rate, float)
    points = [("closed", c) for c in closed] + [("open", r) for r in rates]
    total = args.warmup_requests + args.requests * len(points)
    workload = build_workload(workload_plan(args), fleet, requests=total, seed=args.seed)
    base = _gateway_base(args.gateway_config)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    records: list[dict[str, Any]] = []
    with _progress(total * len(policies), not args.no_progress) as tick:
        for policy in policies:
            config = DesConfig(fleet, policy=policy, gateway=base, tokenizer=args.tokenizer,
                               scrape_interval_s=args.scrape_interval,
                               gateway_overhead_s=args.gateway_overhead_ms / 1e3,
                               record_chunks=args.chunk_times, seed=args.seed, views=views,
                               flow_control=args.flow_control)  # fmt: skip
            sim = Simulation(config)
            stream = iter(workload.requests())
            if args.warmup_requests:
                # As kvgate bench: closed loop at the top concurrency, at most 2 per replica.
                warm = LoadConfig(concurrency=int(min(max(closed or [1.0]), 2 * args.replicas)),
                                  max_requests=args.warmup_requests, duration_s=INF,
                                  seed=args.seed)  # fmt: skip
                sim.run(_take(stream, args.warmup_requests), warm, on_done=tick)
            for mode, value in points:
                load = LoadConfig(
                    concurrency=int(value) if mode == "closed" else None,
                    rate=value if mode == "open" else None,
                    burstiness=args.burstiness, max_requests=args.requests, duration_s=args.duration,
                    warmup_s=args.warmup_s, drain_timeout_s=args.drain, request_timeout_s=args.timeout,
                    seed=args.seed,
                )  # fmt: skip
                result = sim.run(_take(stream, args.requests), load, on_done=tick)
                record = result.to_record(workload=workload.name, slo=slo)
                records.append(record)
                print(_line(record, result), flush=True)
    if args.out is not None:
        meta = make_meta(command=command, slo=slo, simulator_profile=fleet.profile, time_scale=None,
                         fleet_size=fleet.replicas, driver="des",
                         clock="virtual: simulated seconds of a discrete-event run, no wall clock",
                         fleet={"replicas": fleet.replicas, "profile": fleet.profile,
                                "kv_blocks": args.kv_blocks, "model": fleet.model_name},
                         workloads=[workload.describe()], policies=policies)  # fmt: skip
        write_results(args.out / "results.json", meta, records)
        write_report({"meta": meta, "runs": records}, args.out)
    return records


def _take(stream: Iterator[RequestSpec], n: int) -> Iterator[RequestSpec]:
    return itertools.islice(stream, n)


def _line(record: dict[str, Any], result: DesResult) -> str:
    load = f"c={record['concurrency']}" if record["mode"] == "closed" else f"rate={record['rate']:g}/s"
    des = record["des"]

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}s"

    hit = record["prefix_hit_rate"]
    p99 = des["in_flight_skew"]["p99"]
    skew = "-" if p99 is None else f"{p99:.1f}"
    gateways = f", {des['gateways']} gateways" if des["gateways"] > 1 else ""
    wait = des.get("gateway_wait_s")
    if wait is not None:
        gateways += f", held {wait['held']}/{wait['n']} at kvgate (wait p90 {s(wait['p90'])})"
    return (
        f"{record['policy']:>13} {record['workload']} {load}: {record['completed']}/{record['requests']} ok, "
        f"TTFT p50 {s(record['ttft_p50_s'])} p90 {s(record['ttft_p90_s'])}, "
        f"TPOT p90 {s(record['tpot_p90_s'])}, "
        f"{record['output_tok_s']:.0f} tok/s, hit rate {'-' if hit is None else f'{hit:.1%}'}{gateways}, "
        f"in-flight skew p99 {skew}; "
        f"wall {des['wall_s']:.1f}s (CPU {des['cpu_s']:.1f}s), {des['events']} events "
        f"({result.events_per_s:.0f}/s), {des['virtual_s']:.1f} simulated s, "
        f"peak RSS {des['peak_rss_mb']:.0f} MB"
    )


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit="req", dynamic_ncols=True, mininterval=1.0)

    def tick(_trace: RequestTrace) -> None:
        bar.update(1)

    try:
        yield tick
    finally:
        bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.requests < 1 or args.replicas < 1:
        parser.error("--requests and --replicas must be >= 1")
    try:
        Slo() if not args.slo else parse_slo(args.slo)
    except ValueError as err:
        parser.error(str(err))
    command = "python -m loadtests.des_cli " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    try:
        run(args, command)
    except ValueError as err:
        print(f"des_cli: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
