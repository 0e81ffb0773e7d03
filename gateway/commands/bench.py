"""`kvgate bench --out DIR [--preset quick|full|NAME] [overrides...]`: routing policies side by side.

Starts a simulated fleet (`kvgate sim`), then for each policy a fresh `kvgate serve` over it, resets the
fleet's prefix caches between policies, sweeps the load, and writes DIR/results.json, DIR/summary.md,
PNG plots (see `loadtests.bench`) and DIR/logs/ (each gateway's log and access log, the simulator's log).
Flags override the preset's fields; times are simulated seconds.
Importing this module is cheap: the load generator and the report load in `run`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="results directory (created); required unless --list-presets")
    p.add_argument("--preset", default="quick", help="quick (default), full, tiny, or another preset name")
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    p.add_argument(
        "--workload",
        type=_csv,
        default=None,
        help="comma-separated workloads: shared-prefix, random, multi-turn, lora-mix, noisy-neighbour",
    )
    p.add_argument(
        "--policies",
        type=_csv,
        default=None,
        help="comma-separated scheduling profiles (built-in or from --profiles), 'direct' for "
        "no gateway, e.g. round-robin,least-loaded,prefix-only,default",
    )
    p.add_argument(
        "--direct",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also (or not) send straight to one replica, no gateway, at the lowest load points",
    )
    p.add_argument("--concurrency", type=_ints, default=None, help="closed-loop sweep, e.g. 1,4,16,64")
    p.add_argument(
        "--rate",
        type=_floats,
        default=None,
        help="open-loop arrival rates in requests per simulated second, e.g. 5,10,20",
    )
    p.add_argument(
        "--requests", type=int, default=None, help="requests per load point (default: the preset's)"
    )
    p.add_argument(
        "--warmup-requests",
        type=int,
        default=None,
        help="unmeasured requests each policy sends before its first load point",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="unmeasured start of each load point, simulated seconds (default: the preset's); the "
        "closed loop's clients all send at once when a point starts",
    )
    p.add_argument(
        "--duration", type=float, default=None, help="upper bound of one load point, simulated seconds"
    )
    p.add_argument(
        "--open-duration",
        type=float,
        default=None,
        help="open-loop points: seconds of arrivals (simulated), default 10",
    )
    p.add_argument("--replicas", type=int, default=None, help="simulated replicas")
    p.add_argument("--profile", default=None, help="simulator model/GPU profile, e.g. llama-3-8b-h100")
    p.add_argument("--time-scale", type=float, default=None, help="wall seconds per simulated second")
    p.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="KV blocks per replica (shrinks the profile's cache; 0 = the profile's own)",
    )
    p.add_argument("--slo", default=None, help="goodput thresholds, e.g. ttft=1s,tpot=50ms (simulated time)")
    p.add_argument("--seed", type=int, default=None, help="workload and tie-break seed")
    p.add_argument(
        "--profiles",
        type=Path,
        default=None,
        help="YAML file of extra scheduling profiles (name: {filters, scorers, picker}), as "
        "under scheduling.profiles in the config",
    )
    p.add_argument(
        "--gateway-tokenizer",
        choices=("none", "sim"),
        default=None,
        help="the gateway's tokenizer for the model: none (~4 bytes per token) or sim (exact)",
    )
    p.add_argument(
        "--predicted-admission",
        choices=("on", "off"),
        default=None,
        help="the gateway's flow_control.predicted_admission (default: kvgate's, on); the pool's "
        "latency prior is the simulator profile's either way",
    )
    p.add_argument(
        "--session-header",
        nargs="?",
        const="x-session-id",
        default=None,
        metavar="NAME",
        help="multi-turn: send each conversation's id in this header (default name x-session-id, the "
        "gateway's scheduling.session_header); default: no header",
    )
    p.add_argument("--knee-factor", type=float, default=None, help="the gateway's flow_control.knee_factor")
    p.add_argument(
        "--solo-knee-factor", type=float, default=None, help="the gateway's flow_control.solo_knee_factor"
    )
    p.add_argument(
        "--light-knee-factor", type=float, default=None, help="the gateway's flow_control.light_knee_factor"
    )
    p.add_argument("--light-reserve", type=int, default=None, help="the gateway's flow_control.light_reserve")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--des", action="store_true",
                   help="what-if mode: run the same preset in virtual time (loadtests.des_cli), one "
                        "results directory per workload under --out")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from loadtests.presets import PRESETS

    if args.list_presets:
        for name, preset in PRESETS.items():
            print(f"{name}: {preset.description}")
        return 0
    if args.out is None:
        print("kvgate bench: --out DIR is required", file=sys.stderr)
        return 2
    if args.des:
        try:
            return _run_des(args)
        except (ValueError, OSError) as exc:
            print(f"kvgate bench --des: {exc}", file=sys.stderr)
            return 2
    try:
        preset, plans = resolve(args)
    except (ValueError, OSError) as exc:
        print(f"kvgate bench: {exc}", file=sys.stderr)
        return 2
    from loadtests.bench import run_bench_sync

    command = shlex.join(["kvgate", *sys.argv[1:]])
    try:
        outcome = run_bench_sync(
            preset, plans, args.out, command=command, pin=not args.no_pin, progress=not args.no_progress
        )
    except KeyboardInterrupt:
        print(f"kvgate bench: interrupted; {_left_behind(args.out)}", file=sys.stderr)
        return 130
    except BaseException as exc:  # CancelledError from SIGTERM included
        if type(exc).__name__ == "CancelledError":
            print(f"kvgate bench: terminated; {_left_behind(args.out)}", file=sys.stderr)
            return 143
        raise
    print(f"kvgate bench: {outcome.records} runs -> {outcome.results}, {outcome.summary}, "
          f"{len(outcome.plots)} plots")  # fmt: skip
    return 0


def _left_behind(out: Path) -> str:
    """What an interrupted run left in `out`: partial results, or (stopped while the summary and
    plots were being written) complete ones without them."""
    results = out / "results.json"
    try:
        import orjson

        complete = orjson.loads(results.read_bytes())["meta"]["complete"] is True
    except (OSError, ValueError, KeyError, TypeError):
        complete = False
    if complete:
        return f"the results in {results} are complete; the summary and plots may be missing"
    return f"partial results in {results}"


def resolve(args: argparse.Namespace) -> tuple[Any, Any]:
    """The preset with the command line's overrides applied, and the workload plans to run."""
    import dataclasses

    import yaml

    from loadtests.presets import DIRECT, get_preset, workload_plans
    from policies.scheduling.builtin_profiles import BUILTIN_PROFILE_NAMES

    preset = get_preset(args.preset)
    fleet_changes: dict[str, Any] = {}
    for flag, field in (("replicas", "replicas"), ("profile", "profile"), ("time_scale", "time_scale")):
        if getattr(args, flag) is not None:
            fleet_changes[field] = getattr(args, flag)
    if args.kv_blocks is not None:
        fleet_changes["kv_blocks"] = args.kv_blocks or None
    changes: dict[str, Any] = {}
    if fleet_changes:
        changes["fleet"] = dataclasses.replace(preset.fleet, **fleet_changes)
    if args.concurrency is not None or args.rate is not None:
        changes["concurrency"] = tuple(args.concurrency or ())
        changes["rates"] = tuple(args.rate or ())
    for flag, field in (("requests", "requests"), ("warmup_requests", "warmup_requests"),
                        ("warmup_s", "warmup_s"), ("duration", "max_duration_s"),
                        ("open_duration", "open_duration_s"), ("slo", "slo"),
                        ("seed", "seed"),
                        ("gateway_tokenizer", "gateway_tokenizer")):  # fmt: skip
        if getattr(args, flag) is not None:
            changes[field] = getattr(args, flag)
    flow = dict(preset.flow_control)
    if args.predicted_admission is not None:
        flow["predicted_admission"] = args.predicted_admission == "on"
    if args.knee_factor is not None:
        flow["knee_factor"] = args.knee_factor
    if args.solo_knee_factor is not None:
        flow["solo_knee_factor"] = args.solo_knee_factor
    if args.light_knee_factor is not None:
        flow["light_knee_factor"] = args.light_knee_factor
    if args.light_reserve is not None:
        flow["light_reserve"] = args.light_reserve
    if flow:
        changes["flow_control"] = flow
    profiles = dict(preset.profiles)
    if args.profiles is not None:
        loaded = yaml.safe_load(args.profiles.read_text())
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.profiles}: expected a mapping of profile name to profile")
        profiles.update(loaded)
        changes["profiles"] = profiles
    policies = list(args.policies) if args.policies is not None else list(preset.policies)
    if args.direct is True and DIRECT not in policies:
        policies.append(DIRECT)
    if args.direct is False:
        policies = [p for p in policies if p != DIRECT]
    known = {*BUILTIN_PROFILE_NAMES, *profiles, DIRECT}
    unknown = [p for p in policies if p not in known]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(sorted(known))}")
    changes["policies"] = tuple(policies)
    if args.slo is not None:
        from loadtests.slo import parse_slo

        parse_slo(args.slo)  # SloError (a ValueError) names the bad part
    preset = preset.with_overrides(**changes)
    plans = workload_plans(preset, args.workload)
    if getattr(args, "session_header", None):
        plans = tuple(
            dataclasses.replace(p, params={**p.params, "session_header": args.session_header})
            if p.workload == "multi-turn"
            else p
            for p in plans
        )
    return preset, plans


def _run_des(args: argparse.Namespace) -> int:
    import importlib
    import importlib.util

    if importlib.util.find_spec("loadtests.des_cli") is None:
        print(
            "kvgate bench --des: the discrete-event mode (loadtests.des_cli) is not installed",
            file=sys.stderr,
        )
        return 2
    from loadtests.bench_des import run_des

    preset, plans = resolve(args)
    des_cli = importlib.import_module("loadtests.des_cli")
    return run_des(preset, plans, args.out, des_cli.main, progress=not args.no_progress)
