"""`models[].latency_prior` and the priors the Router's latency models start from."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_config
from gateway.config_latency import profile_prior
from gateway.routing import latency_priors
from policies.latency.prior import LatencyPrior
from simulator.profiles import get_profile

REPLICA = {"url": "http://127.0.0.1:9", "model": "m"}


def test_a_simulator_profile_gives_its_roofline() -> None:
    r = get_profile("llama-3-8b-h100").roofline()
    p = profile_prior("llama-3-8b-h100", 2.0)
    assert p.prefill_s_per_token == pytest.approx(2 * r.s_per_token)
    assert p.decode_step_s == pytest.approx(2 * (r.s_weights + r.overhead_s))
    # The defaults are the same GPU and model's napkin numbers.
    default = profile_prior("llama-3-8b-h100")
    assert default.prefill_s_per_token == pytest.approx(LatencyPrior().prefill_s_per_token, rel=0.01)
    assert default.decode_step_s == pytest.approx(LatencyPrior().decode_step_s, rel=0.01)


def test_pool_priors_numbers_override_the_profile() -> None:
    cfg = parse_config({
        "replicas": [REPLICA],
        "models": [
            {"name": "m", "latency_prior": {"profile": "tiny", "time_scale": 3.0, "ttft_fixed_s": 0.05}},
            {"name": "other", "latency_prior": {"prefill_s_per_token": 1e-4}},
        ],
    })  # fmt: skip
    priors, default = latency_priors(cfg)
    tiny = profile_prior("tiny", 3.0)
    expected = LatencyPrior(tiny.prefill_s_per_token, 0.05, tiny.decode_step_s, tiny.decode_s_per_kv_token)
    assert priors["m"] == expected
    assert priors["other"].prefill_s_per_token == 1e-4
    assert priors["other"].decode_step_s == LatencyPrior().decode_step_s
    assert default == LatencyPrior()


def test_the_step_token_budget_is_configurable_per_pool() -> None:
    cfg = parse_config({
        "replicas": [REPLICA],
        "models": [{"name": "m", "latency_prior": {"profile": "tiny", "step_tokens": 2048}},
                   {"name": "other", "latency_prior": {"prefill_s_per_token": 1e-4}}],
    })  # fmt: skip
    priors, _ = latency_priors(cfg)
    assert priors["m"].step_tokens == 2048
    assert priors["m"].prefill_s_per_token == profile_prior("tiny").prefill_s_per_token
    assert priors["other"].step_tokens == 8192  # vLLM's default


def test_the_embedded_fleet_gives_the_default_prior() -> None:
    cfg = parse_config({"simulator": {"profile": "tiny", "time_scale": 2.0}})
    assert latency_priors(cfg) == ({}, profile_prior("tiny", 2.0))


@pytest.mark.parametrize(
    ("prior", "match"),
    [({"profile": "h100-9000"}, "unknown profile"), ({"prefill_s_per_token": 0}, "greater than 0"),
     ({"speed": 2}, "speed"), ({"step_tokens": 0}, "greater than or equal to 1")],
)  # fmt: skip
def test_bad_priors_are_refused(prior: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"replicas": [REPLICA], "models": [{"name": "m", "latency_prior": prior}]})
