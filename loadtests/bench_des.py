"""`kvgate bench --des`: the same preset run in virtual time by `loadtests.des_cli` (the what-if mode).

The bench's resolved preset is translated into `des_cli` arguments, one `des_cli` run per workload
(two with both a closed-loop sweep and open-loop rates), each writing its own results directory
`OUT/des-<workload>/` (`OUT/des-<workload>-open/` for the rates) (`results.json` in the bench's schema,
`summary.md`, plots). What does not translate is said: `direct` (there is no HTTP in virtual time), and
workload parameters `des_cli` has no flag for (they fall back to its defaults). The DES sends the same
number of requests at every load point: the preset's `requests`, else the largest point's count.

Flow control runs as in the live bench's gateway (`--flow-control`: kvgate's admission queue and
latency gate, with the preset's `flow_control` settings, e.g. `--predicted-admission off`), in the
DES's own time (no time scale: the bands' waits are kvgate's defaults). Before 2026-12-05 the DES did
not model flow control, and `--des` figures of that time are with the gate off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from loadtests.presets import DIRECT, BenchPreset
from loadtests.workload_factory import WorkloadPlan

_PARAM_FLAGS: dict[str, str] = {
    "system_prompt_tokens": "--system-prompt-tokens",
    "question_tokens": "--question-tokens",
    "prompt_tokens": "--prompt-tokens",
    "user_tokens": "--user-tokens",
    "turns": "--turns",
    "output_tokens": "--output-tokens",
    "groups": "--groups",
    "target_multiple": "--target-multiple",
    "session_header": "--session-header",
    "active_conversations": "--active-conversations",
    "length_jitter": "--length-jitter",
    "output_jitter": "--output-jitter",
    "zipf_s": "--zipf-s",
}


def _csv(values: Sequence[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


def des_argv(
    preset: BenchPreset, plan: WorkloadPlan, out_dir: Path, gateway_config: Path | None, *, progress: bool
) -> tuple[list[list[str]], list[str]]:
    """`des_cli` argument lists for one workload of `preset` (one run for the closed-loop sweep, one
    for the open-loop rates: `des_cli` takes one or the other), and notes on what did not carry over.
    Results go to `out_dir/des-<workload>` (and `...-open` for the rates when there are both)."""
    fleet = preset.fleet
    notes: list[str] = []
    argv = [
        "--replicas", str(fleet.replicas), "--profile", fleet.profile, "--block-size", str(fleet.block_size),
        "--max-num-seqs", str(fleet.max_num_seqs),
        "--max-num-batched-tokens", str(fleet.max_num_batched_tokens),
        "--workload", plan.workload, "--tokenizer", preset.gateway_tokenizer, "--slo", preset.slo,
        "--seed", str(preset.seed), "--warmup-requests", str(preset.plan_warmup(plan)),
        "--warmup-s", f"{preset.warmup_s:g}", "--drain", f"{preset.drain_s:g}", "--flow-control",
    ]  # fmt: skip
    if fleet.kv_blocks is not None:
        argv += ["--kv-blocks", str(fleet.kv_blocks)]
    if fleet.adapters:
        argv += ["--max-loras", str(max(1, fleet.max_loras)), "--adapters", str(len(fleet.adapters))]
    policies = [p for p in preset.policies_for(plan) if p != DIRECT]
    if len(policies) != len(preset.policies_for(plan)):
        notes.append("direct skipped: there is no HTTP path in virtual time")
    argv += ["--policy", ",".join(policies)]
    if gateway_config is not None:
        argv += ["--gateway-config", str(gateway_config)]
    per_point = preset.requests or max(preset.point_requests(m, x) for m, x in preset.load_points())
    argv += ["--requests", str(per_point)]
    for key, value in plan.params.items():
        flag = _PARAM_FLAGS.get(key)
        if flag is None:
            notes.append(f"{plan.name}: {key}={value} has no des_cli flag (its default applies)")
        else:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if not progress:
        argv.append("--no-progress")
    out = out_dir / f"des-{plan.name}"
    runs = []
    if preset.concurrency:
        closed = ["--concurrency", _csv(preset.concurrency), "--duration", f"{preset.max_duration_s:g}"]
        runs.append([*argv, *closed, "--out", str(out)])
    if preset.rates:
        open_out = out.with_name(out.name + "-open") if preset.concurrency else out
        rates = ["--rate", _csv(preset.rates), "--duration", f"{preset.open_duration_s:g}"]
        runs.append([*argv, *rates, "--out", str(open_out)])
    return runs, notes


def run_des(
    preset: BenchPreset,
    plans: Sequence[WorkloadPlan],
    out_dir: Path,
    des_main: Callable[[Sequence[str]], int],
    *,
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> int:
    """Run each workload through `des_main` (`loadtests.des_cli.main`); the first non-zero exit code,
    else 0. Custom profiles and the preset's flow-control settings go to the DES through a generated
    gateway config (`OUT/des-gateway.yaml`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config: Path | None = None
    data: dict[str, Any] = {}
    if preset.profiles:
        data["scheduling"] = {"profiles": {name: dict(spec) for name, spec in preset.profiles.items()}}
    if preset.flow_control:
        data["flow_control"] = dict(preset.flow_control)
    if data:
        config = out_dir / "des-gateway.yaml"
        config.write_text(yaml.safe_dump(data, sort_keys=False))
    for plan in plans:
        runs, notes = des_argv(preset, plan, out_dir, config, progress=progress)
        for note in notes:
            say(f"kvgate bench --des: {note}")
        for argv in runs:
            say("python -m loadtests.des_cli " + " ".join(argv))
            code = des_main(argv)
            if code != 0:
                return code
    return 0
