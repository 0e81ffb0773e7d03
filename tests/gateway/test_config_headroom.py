"""`headroom:` and `headroom_slos`: the SLOs goodput headroom counts against, with or without the
flow-control bands' own SLO settings (admission on predicted latency adds them)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.config import ConfigError, parse_config
from gateway.config_headroom import HeadroomConfig, headroom_slos
from policies.latency.headroom import Mix, Slos


def test_defaults_and_the_configured_values() -> None:
    assert headroom_slos(parse_config({})) == Slos(ttft_s=1.0, tpot_s=0.1)
    config = parse_config({"headroom": {"ttft_slo_s": 0.4, "tpot_slo_s": 0.02, "default_output_tokens": 50}})
    assert headroom_slos(config) == Slos(ttft_s=0.4, tpot_s=0.02)
    assert config.headroom.default_mix() == Mix(1000.0, 1000.0, 50.0)


@pytest.mark.parametrize(
    "bad", [{"ttft_slo_s": 0}, {"tpot_slo_s": -1}, {"default_output_tokens": 0}, {"x": 1}]
)
def test_bad_values_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="headroom"):
        parse_config({"headroom": bad})


def test_the_standard_bands_slos_win_when_the_config_has_them() -> None:
    own = HeadroomConfig(ttft_slo_s=1.0, tpot_slo_s=0.1)

    def config(**band: float | None) -> SimpleNamespace:
        flow = SimpleNamespace(bands={"standard": SimpleNamespace(max_wait_s=10.0, **band)})
        return SimpleNamespace(headroom=own, flow_control=flow)

    assert headroom_slos(config(ttft_slo_s=0.3, tpot_slo_s=0.05)) == Slos(0.3, 0.05)
    assert headroom_slos(config(ttft_slo_s=0.3)) == Slos(0.3, 0.1)  # either alone
    assert headroom_slos(config(ttft_slo_s=None, tpot_slo_s=None)) == Slos(1.0, 0.1)
    assert headroom_slos(config()) == Slos(1.0, 0.1)  # a config without the settings at all
