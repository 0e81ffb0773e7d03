"""The latency gate's settings and SLOs in the config (gateway/config_slo.py), and the
`x-kvgate-ttft-slo-ms` header at admission (gateway/tenancy.py): validated, tightening only."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from gateway.config_slo import DEFAULT_KNEE_FACTOR, DEFAULT_LIGHT_KNEE_FACTOR, DEFAULT_SOLO_KNEE_FACTOR
from gateway.errors import GatewayError
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.state import FleetState
from gateway.metrics import GatewayMetrics
from gateway.tenancy import Tenancy
from policies.latency.estimator import LatencyEstimator
from policies.latency_admission import LatencySlo
from policies.types import RequestInfo
from tests.gateway.stores.fakes import FakeClock

REPLICAS = [{"url": "http://r:1", "model": "m", "name": "r"}]


def test_defaults() -> None:
    fc = parse_config({}).flow_control
    assert fc.knee_factor == DEFAULT_KNEE_FACTOR
    assert fc.solo_knee_factor == DEFAULT_SOLO_KNEE_FACTOR
    assert fc.light_knee_factor == DEFAULT_LIGHT_KNEE_FACTOR == 1.5
    assert fc.light_reserve == 1  # docs/benchmarks.md, "The light reserve at the light knee"
    assert fc.predicted_admission  # on by default (docs/benchmarks.md, "Admission on predicted latency")
    assert fc.bands["standard"].ttft_slo_s is None and fc.bands["standard"].tpot_slo_s is None


def test_slos_parse_into_the_tenant_policy() -> None:
    cfg = parse_config(
        {
            "tenants": [{"name": "acme", "slo": {"ttft_s": 0.5, "tpot_s": 0.05}}],
            "flow_control": {
                "predicted_admission": True,
                "knee_factor": 1.5,
                "bands": {"standard": {"max_wait_s": 5, "ttft_slo_s": 2.0, "tpot_slo_s": 0.1}},
            },
        }
    )
    assert cfg.tenants[0].slo.slo() == LatencySlo(0.5, 0.05)
    assert cfg.flow_control.knee_factor == 1.5 and cfg.flow_control.predicted_admission
    assert cfg.flow_control.bands["standard"].ttft_slo_s == 2.0


@pytest.mark.parametrize(
    "flow",
    [
        {"knee_factor": 1.0},  # 1 would admit nothing beside a running request
        {"knee_factor": 0.5},
        {"knee_factor": "inf"},
        {"knee_factor": 1000},
        {"solo_knee_factor": 1.0},
        {"solo_knee_factor": "nan"},
        {"light_knee_factor": 1.0},
        {"light_knee_factor": 101},
        {"light_knee_factor": "inf"},
        {"light_knee_factor": "high"},
        {"light_reserve": -1},
        {"light_reserve": 1.5},
        {"predicted_admission": "maybe"},
        {"bands": {"standard": {"max_wait_s": 1, "ttft_slo_s": 0}}},
        {"bands": {"standard": {"max_wait_s": 1, "tpot_slo_s": -0.1}}},
        {"bands": {"standard": {"max_wait_s": 1, "ttft_slo_s": "nan"}}},
        {"bands": {"standard": {"max_wait_s": 1, "ttft_slo_ms": 100}}},  # unknown key
    ],
)
def test_bad_flow_control_settings_are_refused(flow: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="flow_control"):
        parse_config({"flow_control": flow})


def test_a_bad_light_knee_factor_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"flow_control\.light_knee_factor"):
        parse_config({"flow_control": {"light_knee_factor": 0.9}})
    with pytest.raises(ConfigError, match=r"flow_control\.light_reserve"):
        parse_config({"flow_control": {"light_reserve": -1}})
    # Below knee_factor is allowed: the larger of the two applies, as for solo_knee_factor.
    assert parse_config({"flow_control": {"knee_factor": 2.0}}).flow_control.light_knee_factor == 1.5


@pytest.mark.parametrize("slo", [{"ttft_s": 0}, {"tpot_s": -1}, {"ttft_s": "inf"}, {"ttft_ms": 100}, "fast"])
def test_bad_tenant_slos_are_refused(slo: Any) -> None:
    with pytest.raises(ConfigError, match=r"tenants\.0\.slo"):
        parse_config({"tenants": [{"name": "acme", "slo": slo}]})


def tenancy(**flow: Any) -> Tenancy:
    config = parse_config({"replicas": REPLICAS, "flow_control": {"predicted_admission": True, **flow}})
    clock = FakeClock()
    fleet = FleetState(config.replicas, config.fleet, clock)
    fleet.record_scrape("r", ReplicaMetrics(running=0, waiting=0, kv_usage=0.0))
    return Tenancy(config, fleet, GatewayMetrics(), clock, latency=LatencyEstimator(16))


INFO = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=1000, max_tokens=64)


@pytest.mark.parametrize("raw", [b"abc", b"-1", b"0", b"1e9", b"nan", b"\xff", b"", b"9" * 40])
async def test_a_malformed_header_is_a_400_naming_it(raw: bytes) -> None:
    t = tenancy()
    tenant = t.registry.keyless
    assert tenant is not None
    with pytest.raises(GatewayError) as err:
        await t.admit(tenant, INFO, None, raw)
    assert err.value.status == 400 and err.value.param == "x-kvgate-ttft-slo-ms"
    assert t.in_flight.get(tenant.name, 0) == 0  # nothing held


async def test_a_well_formed_header_admits_and_a_looser_one_is_harmless() -> None:
    t = tenancy()
    tenant = t.registry.keyless
    assert tenant is not None
    for raw in (b"250", b"3600000", None):
        admitted = await t.admit(tenant, INFO, None, raw)
        await t.settle(admitted, None, None)
