from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.des_gateways import BEFORE, FIX, RANDOM, gateway_config, main, summarize
from policies.scheduling.builtin_profiles import builtin_profile_spec

pytestmark = pytest.mark.timeout(120)


def row(gateways: int, policy: str, seed: int, hit: float, ttft: float) -> dict[str, object]:
    return {"replicas": 8, "workload": "shared-prefix", "gateways": gateways, "seed": seed, "policy": policy,
            "prefix_hit_rate": hit, "goodput_rps": 10.0, "ttft_p90_s": ttft, "skew_p99": 2.0}  # fmt: skip


def test_the_unfixed_profile_differs_from_the_default_only_in_its_picker() -> None:
    profiles = gateway_config()["scheduling"]["profiles"]
    before, rng_only = profiles[BEFORE], profiles[RANDOM]
    default = builtin_profile_spec("default")
    assert before["picker"] == {"type": "max-score"} and default["picker"]["type"] == "near-best"
    assert rng_only["picker"]["params"] == {**default["picker"]["params"], "hash_blocks": 0}
    del before["picker"], default["picker"], rng_only["picker"]
    assert before == default == rng_only


def test_summary_gives_median_and_worst_seed_and_per_seed_ratios() -> None:
    rows = [row(4, BEFORE, 0, 0.40, 0.20), row(4, FIX, 0, 0.60, 0.10),
            row(4, BEFORE, 1, 0.50, 0.20), row(4, FIX, 1, 0.45, 0.30),
            row(4, BEFORE, 2, 0.30, 0.40), row(4, FIX, 2, 0.60, 0.20)]  # fmt: skip
    table = summarize(rows)
    fix_line = next(line for line in table.splitlines() if line.startswith("| 4 | near-best"))
    cells = [c.strip() for c in fix_line.strip("|").split("|")]
    assert cells[3] == "60.0% (45.0%)"  # hit rate: median, worst = lowest
    assert cells[5] == "0.200 (0.300)"  # TTFT p90: median, worst = highest
    assert cells[7] == "1.50 (0.90)"  # hit rate ratios per seed 1.5, 0.9, 2.0: median, worst = lowest
    assert cells[9] == "0.50 (1.50)"  # TTFT ratios 0.5, 1.5, 0.5: median, worst = highest


def test_a_small_sweep_appends_records_and_summarizes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.jsonl"
    code = main(["--replicas", "4", "--gateways", "1,2", "--seeds", "0", "--workloads", "shared-prefix",
                 "--requests-per-replica", "10", "--system-prompt-tokens", "256", "--question-tokens", "16",
                 "--output-tokens", "4", "--out", str(out)])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = sorted((r["gateways"], r["policy"]) for r in rows)
    assert cases == [(1, FIX), (1, BEFORE), (2, FIX), (2, BEFORE)]
    assert all(r["completed"] == 40 for r in rows)
    capsys.readouterr()
    assert main(["--summarize", str(out)]) == 0
    assert "| 2 | near-best (fix) | 1 |" in capsys.readouterr().out
