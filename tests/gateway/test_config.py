"""The config refuses unknown keys and bad values with the field's path and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config
from gateway.config_check import check_semantics

GOOD_KEY = "sha256:" + "ab" * 32
KEY2 = "sha256:" + "cd" * 32


def quota(**q: object) -> dict[str, object]:
    return {"tenants": [{"name": "a", "quotas": [{"per": "day", **q}]}]}


def key(**k: object) -> dict[str, object]:
    return {"tenants": [{"name": "a", "keys": [{"name": "k", "hash": GOOD_KEY, **k}]}]}


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
        # quotas: the unit, the period, the zone, the limit, warn_at and model patterns
        (quota(tokens=1, requests=1), "tenants.0.quotas.0: a quota counts either `tokens` or `requests`"),
        (quota(), "tenants.0.quotas.0: a quota counts either"),
        (quota(tokens=1, per="year"), "tenants.0.quotas.0.per: Input should be 'day', 'week' or 'month'"),
        (quota(tokens=0), "tenants.0.quotas.0.tokens: Input should be greater than 0"),
        (quota(requests=-5), "tenants.0.quotas.0.requests: Input should be greater than 0"),
        (quota(tokens=1, timezone="Mars/Olympus"), "tenants.0.quotas.0.timezone: unknown time zone 'Mars/"),
        (quota(tokens=1, warn_at=1.0), "tenants.0.quotas.0.warn_at: Input should be less than 1"),
        (quota(tokens=1, warn_at=0), "tenants.0.quotas.0.warn_at: Input should be greater than 0"),
        (quota(tokens=1, models=[]), "tenants.0.quotas.0.models: an empty list would match no model"),
        (quota(tokens=1, models=[" x"]), "tenants.0.quotas.0.models: model pattern ' x' is empty"),
        (quota(tokens=1, name="a b"), "tenants.0.quotas.0.name: String should match pattern"),
        (
            {
                "tenants": [
                    {"name": "a", "quotas": [{"tokens": 1, "per": "day"}, {"tokens": 2, "per": "day"}]}
                ]
            },
            "tenants.0.quotas: two quotas are both named ['tokens-per-day']",
        ),
        # named keys
        (key(name="unnamed-1"), "tenants.0.keys.0.name: names starting with 'unnamed-'"),
        (key(hash="plaintext"), "tenants.0.keys.0.hash: api keys are stored hashed"),
        (key(limits={"rpm": 0}), "tenants.0.keys.0.limits.rpm: Input should be greater than or equal to 1"),
        (key(limits={"max_output_tokens": 5}), "tenants.0.keys.0.limits.max_output_tokens: unknown key"),
        (key(quotas=[{"tokens": 1, "per": "fortnight"}]), "tenants.0.keys.0.quotas.0.per"),
        (
            {
                "tenants": [
                    {"name": "a", "keys": [{"name": "k", "hash": GOOD_KEY}, {"name": "k", "hash": KEY2}]}
                ]
            },
            "tenants.0.keys: duplicate key names ['k']",
        ),
        (
            {
                "tenants": [
                    {"name": "a", "api_keys": [GOOD_KEY]},
                    {"name": "b", "keys": [{"name": "k", "hash": GOOD_KEY}]},
                ]
            },
            "more than one tenant",
        ),
        # admin keys: plain hashes or {name, hash}
        ({"auth": {"admin_keys": ["plaintext"]}}, "auth.admin_keys: api keys are stored hashed"),
        ({"auth": {"admin_keys": [{"name": "ops", "hash": "x"}]}}, "auth.admin_keys.0"),
        (
            {"auth": {"admin_keys": [{"name": "ops", "hash": GOOD_KEY}, {"name": "ops", "hash": KEY2}]}},
            "auth.admin_keys: duplicate admin key names ['ops']",
        ),
        ({"ledger": {"flush_interval_s": 0}}, "ledger.flush_interval_s: Input should be greater than 0"),
        ({"ledger": {"retention_days": 0}}, "ledger.retention_days"),
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


def test_quotas_keys_and_named_admins_as_the_issue_writes_them() -> None:
    c = parse_config(
        {
            "tenants": [
                {
                    "name": "acme",
                    "quotas": [
                        {"tokens": 50_000_000, "per": "month", "warn_at": 0.8},
                        {"requests": 200_000, "per": "day", "timezone": "Europe/Berlin"},
                        {"tokens": 2_000_000, "per": "day", "models": ["llama-3-70b*"]},
                    ],
                    "keys": [
                        {"name": "ci-bot", "hash": GOOD_KEY, "limits": {"rpm": 60},
                         "quotas": [{"tokens": 100_000, "per": "day"}]},
                    ],
                }
            ],
            "auth": {"admin_keys": [KEY2, {"name": "ops", "hash": "sha256:" + "ef" * 32}]},
        }
    )  # fmt: skip
    acme = c.tenants[0]
    assert [q.display_name for q in acme.quotas] == ["tokens-per-month", "requests-per-day",
                                                     "tokens-per-day[llama-3-70b*]"]  # fmt: skip
    assert [(q.unit, q.limit, q.per, q.timezone) for q in acme.quotas][1] == (
        "requests",
        200_000,
        "day",
        "Europe/Berlin",
    )
    assert acme.keys[0].limits.rpm == 60 and acme.keys[0].quotas[0].display_name == "tokens-per-day"
    assert c.ledger.enabled and c.ledger.flush_interval_s == 1.0
