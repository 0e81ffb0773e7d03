"""Replica credentials: where a key may come from, what is refused, and that it never shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from gateway.replica_auth import ReplicaCredentials

KEY = "s3cret-replica-key"


def config(models: list[dict[str, Any]] | None = None, replicas: list[dict[str, Any]] | None = None) -> Any:
    return parse_config(
        {
            "models": models or [],
            "replicas": replicas or [{"url": "http://a:1", "model": "m", "name": "a"}],
        }
    )


def test_a_pool_credential_applies_to_its_replicas_and_a_replica_s_own_replaces_it(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("replica-b-key\n")  # a mounted Secret often ends with a newline
    cfg = config(
        models=[{"name": "m", "api_key_env": "POOL_KEY"}],
        replicas=[
            {"url": "http://a:1", "model": "m", "name": "a"},
            {"url": "http://b:1", "model": "m", "name": "b", "api_key_file": str(f)},
            {"url": "http://c:1", "model": "other", "name": "c"},
        ],
    )
    creds = ReplicaCredentials.from_config(cfg, {"POOL_KEY": f"  {KEY} "})
    assert creds.headers_for("a", "m") == ((b"authorization", b"Bearer " + KEY.encode()),)
    assert creds.headers_for("b", "m") == ((b"authorization", b"Bearer replica-b-key"),)
    assert creds.headers_for("c", "other") == ()
    # A replica discovered at run time gets its pool's.
    assert creds.headers_for("new-pod", "m") == creds.headers_for("a", "m")
    assert KEY not in repr(creds)


@pytest.mark.parametrize(
    ("model", "env", "message"),
    [
        ({"api_key_env": "MISSING"}, {}, "models[0].api_key_env: the environment variable MISSING is unset"),
        (
            {"api_key_env": "EMPTY"},
            {"EMPTY": "  "},
            "models[0].api_key_env: the environment variable EMPTY is unset or empty",
        ),
        ({"api_key_file": "/nonexistent/key"}, {}, "models[0].api_key_file: cannot read /nonexistent/key"),
        ({"api_key_env": "BAD"}, {"BAD": "line\nbreak"}, "characters a header cannot carry"),
    ],
)
def test_an_unusable_credential_stops_start_up_naming_the_setting_never_the_value(
    model: dict[str, Any], env: dict[str, str], message: str
) -> None:
    cfg = config(models=[{"name": "m", **model}])
    with pytest.raises(ConfigError) as err:
        ReplicaCredentials.from_config(cfg, env)
    assert message in str(err.value)
    assert "line" not in str(err.value) and "break" not in str(err.value)


def test_an_empty_key_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        ReplicaCredentials.from_config(config(models=[{"name": "m", "api_key_file": str(f)}]), {})


def test_a_key_is_never_written_inline_in_the_config() -> None:
    for where in ("models", "replicas"):
        entry = {"name": "m"} if where == "models" else {"url": "http://a:1", "model": "m"}
        with pytest.raises(ConfigError, match="never written in the config") as err:
            parse_config({where: [{**entry, "api_key": KEY}]})
        assert KEY not in str(err.value)


def test_one_source_only() -> None:
    with pytest.raises(ConfigError, match="not both"):
        parse_config({"models": [{"name": "m", "api_key_env": "A", "api_key_file": "/k"}]})


def test_a_replica_that_joins_later_gets_its_own_credential_or_its_pool_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = config(models=[{"name": "m", "api_key_env": "POOL_KEY"}])
    creds = ReplicaCredentials.from_config(cfg, {"POOL_KEY": "pool", "OWN_KEY": "own"})
    joined = parse_config(
        {"replicas": [{"url": "http://n:1", "model": "m", "name": "n", "api_key_env": "OWN_KEY"}]}
    ).replicas[0]
    creds.update_replica("n", joined)
    assert creds.headers_for("n", "m") == ((b"authorization", b"Bearer own"),)
    creds.forget("n")
    assert creds.headers_for("n", "m") == ((b"authorization", b"Bearer pool"),)
    broken = parse_config(
        {"replicas": [{"url": "http://n:1", "model": "m", "name": "n", "api_key_env": "NOT_SET"}]}
    ).replicas[0]
    creds.update_replica("n", broken)  # never raises: logged, and the pool's is sent
    assert creds.headers_for("n", "m") == ((b"authorization", b"Bearer pool"),)
    assert "replica n.api_key_env: the environment variable NOT_SET is unset" in caplog.text
