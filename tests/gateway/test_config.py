"""The config refuses unknown keys and bad values with the field's path and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config
from gateway.config_check import check_semantics

GOOD_KEY = "sha256:" + "ab" * 32


def test_empty_config_is_the_embedded_default() -> None:
    c = parse_config(None)
    assert c.replicas == () and c.simulator.replicas == 4 and c.state.store == "memory://"
    assert c.scheduling.profile == "default"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"server": {"prot": 1}}, "server.prot: unknown key"),
        ({"server": {"port": 70000}}, "server.port: Input should be less than or equal to 65535"),
        ({"replicas": [{"url": "10.0.0.1:8000", "model": "m"}]}, "replicas.0.url: must be an http"),
        ({"replicas": [{"url": "http://a:1"}]}, "replicas.0.model: Field required"),
        ({"fleet": {"scrape_interval_s": 0}}, "fleet.scrape_interval_s: Input should be greater than 0"),
        ({"tenants": [{"name": "a b"}]}, "tenants.0.name: String should match pattern"),
        ({"tenants": [{"name": "a", "api_keys": ["plaintext"]}]}, "tenants.0.api_keys: api keys are stored"),
        ({"tenants": [{"name": "a", "limits": {"tpm": -1}}]}, "tenants.0.limits.tpm"),
        ({"tenants": [{"name": "a", "priority": "urgent"}]}, "tenants.0.priority"),
        ({"state": {"store": "mongodb://x"}}, "state.store: must be 'memory://' or a redis:// URL"),
        ({"flow_control": {"bands": {"urgent": {"max_wait_s": 1}}}}, "flow_control.bands.urgent"),
        (
            {"replicas": [{"url": "http://a:1", "model": "m"}, {"url": "http://a:1", "model": "m"}]},
            "duplicate replica names",
        ),
        ({"tenants": [{"name": "a"}, {"name": "a"}]}, "duplicate tenant names"),
        (
            {"tenants": [{"name": "a", "api_keys": [GOOD_KEY]}, {"name": "b", "api_keys": [GOOD_KEY]}]},
            "more than one tenant",
        ),
        ({"auth": {"anonymous_tenant": "ghost"}}, "auth.anonymous_tenant: no tenant named 'ghost'"),
    ],
)
def test_bad_configs_name_the_path_and_reason(data: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(data)
    assert expected in str(ei.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"server": {"port": -1, "colour": "red"}, "fleet": {"stale_after_s": "soon"}})
    lines = str(ei.value).splitlines()
    assert {line.split(":")[0] for line in lines} == {"server.port", "server.colour", "fleet.stale_after_s"}


@pytest.mark.parametrize(
    ("profiles", "expected"),
    [
        ({"x": {"scorers": [{"type": "telepathy", "weight": 1}]}}, "scheduling.profiles.x"),
        ({"x": {"scorers": [{"type": "queue-depth", "weight": -1}]}}, "weight"),
        ({"x": {"filters": [{"type": "queue-depth"}]}}, "scheduling.profiles.x"),
    ],
)
def test_semantic_check_refuses_bad_plugins(profiles: dict[str, object], expected: str) -> None:
    config = parse_config({"scheduling": {"profiles": profiles}})
    with pytest.raises(ConfigError) as ei:
        check_semantics(config)
    assert expected in str(ei.value)


def test_unknown_profile_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="no profile named 'fastest'"):
        check_semantics(parse_config({"scheduling": {"profile": "fastest"}}))


def test_load_config_reports_yaml_and_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listy)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://user:s3cret@10.0.0.1:8000", "credentials"),
        ("http://user@10.0.0.1:8000", "credentials"),
        ("http://10.0.0.1:8000/v?x=1", "query"),
        ("http://10.0.0.1:8000/?", "query"),
        ("http://10.0.0.1:8000/#top", "fragment"),
        ("http://10.0.0.1:port", "port"),
        ("http://10.0.0.1:70000", "port"),
        ("http://:8000", "host"),
        ("http://10.0.0.1/a b", "spaces"),
        ("http://10.0.0.1/é", "ASCII"),
        ("ftp://10.0.0.1", "http:// or https://"),
    ],
)
def test_replica_urls_that_cannot_work_are_refused(url: str, expected: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"replicas": [{"url": url, "model": "m"}]})
    message = str(ei.value)
    assert message.startswith("replicas.0.url: ") and expected in message
    assert "s3cret" not in message  # a refused URL's password is not echoed into logs


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1:8000", "https://vllm.internal", "http://10.0.0.1:8000/vllm/", "http://[::1]:8000"]
)
def test_replica_urls_that_work(url: str) -> None:
    (replica,) = parse_config({"replicas": [{"url": url, "model": "m"}]}).replicas
    assert replica.url == url.rstrip("/")


def test_upstream_tls_settings() -> None:
    up = parse_config(None).upstream
    assert up.tls_verify is True and up.tls_ca_file is None
    up = parse_config({"upstream": {"tls_ca_file": "/etc/ca.pem", "tls_verify": False}}).upstream
    assert up.tls_ca_file == "/etc/ca.pem" and up.tls_verify is False


def test_semantic_check_loads_the_tls_ca_file(tmp_path: Path) -> None:
    config = parse_config({"upstream": {"tls_ca_file": str(tmp_path / "missing.pem")}})
    with pytest.raises(ConfigError, match=r"upstream.tls_ca_file: cannot load"):
        check_semantics(config)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"upstream.tls_ca_file: cannot load"):
        check_semantics(parse_config({"upstream": {"tls_ca_file": str(junk)}}))
