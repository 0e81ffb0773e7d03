"""`x-kvgate-route`: the winner's scores, and the predicted TTFT of the winner and the runner-up."""

from __future__ import annotations

import random

from gateway.proxy import route_header
from policies.latency.estimator import LatencyEstimator
from policies.scheduling.builtin_profiles import build_builtin_profile
from policies.scheduling.context import SchedulingContext
from policies.types import RequestInfo
from tests.policies.scheduling.builders import NOW, replica


def test_the_header_names_the_winner_and_the_runner_up() -> None:
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=1000, max_tokens=8,
                       prefix_keys=tuple(range(15)))  # fmt: skip
    ctx = SchedulingContext(request=info, now=NOW, prefix_match={"a": 15}, prefix_blocks=15,
                            latency=LatencyEstimator(64))  # fmt: skip
    profile = build_builtin_profile("predicted-latency")
    d = profile.schedule(ctx, [replica("b"), replica("a")], random.Random(0))
    header = route_header(d, "a", [("a", 0.0123), ("b", 0.04567)]).decode()
    fields = dict(part.split("=", 1) for part in header.split(";"))
    assert fields["replica"] == "a" and fields["predicted-latency"] == "1.000"
    assert (fields["ttft_ms"], fields["runner_up"], fields["runner_up_ttft_ms"]) == ("12.3", "b", "45.7")
    assert "runner_up" not in route_header(d, "a", [("a", 0.0123)]).decode()
    assert "ttft_ms" not in route_header(d, "a").decode()
