"""The credentials kvgate presents to replicas (`vllm serve --api-key`), read once at start.

A pool's `models[].api_key_env` / `api_key_file` applies to its replicas; a replica's own setting
replaces it. The key is read from the environment or the file (surrounding whitespace stripped: a
mounted Secret often ends with a newline) when the Gateway is built, and turned into the one header
line it becomes, `Authorization: Bearer <key>`. It is kept nowhere else: no repr, log line, metric or
error message shows it; an error names the setting, never the value.

Replicas that kvgate learns of at run time (discovery) get their pool's credential by pool name, or
their own when their `replicas:` entry (a replicas file) names one: `update_replica` reads it when the
replica joins or moves to a new URL; an unusable one is logged (by setting, not value) and the pool's
is sent instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from gateway.config import Config, ConfigError, ReplicaCredential
from gateway.reload import ReloadStep

log = logging.getLogger(__name__)
Header = tuple[bytes, bytes]
_NONE: tuple[Header, ...] = ()


class ReplicaCredentials:
    """Header lines to send to each replica. Pools' credentials are read at construction and on a
    reload (`prepare`); replicas' change as they join (`update_replica`, `forget`). One event loop."""

    __slots__ = ("_by_pool", "_by_replica", "_env")

    def __init__(
        self,
        by_replica: Mapping[str, Header],
        by_pool: Mapping[str, Header],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._by_replica = {name: (h,) for name, h in by_replica.items()}
        self._by_pool = {name: (h,) for name, h in by_pool.items()}
        self._env = os.environ if environ is None else environ

    @classmethod
    def from_config(cls, config: Config, environ: Mapping[str, str] | None = None) -> ReplicaCredentials:
        """Read every configured credential now. Raises ConfigError naming the setting (never the
        value) when a variable is unset or empty or a file cannot be read or is empty."""
        env = os.environ if environ is None else environ
        by_pool = {
            m.name: _header(m, f"models[{i}]", env) for i, m in enumerate(config.models) if m.has_credential
        }
        by_replica = {
            r.display_name: _header(r, f"replicas[{i}]", env)
            for i, r in enumerate(config.replicas)
            if r.has_credential
        }
        return cls(by_replica, by_pool, env)

    def update_replica(self, name: str, own: ReplicaCredential | None) -> None:
        """`name` joined or moved: its own credential (`own`, read now) or, without one, its pool's.
        Never raises: an unusable credential is logged and the pool's is used."""
        if own is None or not own.has_credential:
            self._by_replica.pop(name, None)
            return
        try:
            self._by_replica[name] = (_header(own, f"replica {name}", self._env),)
        except ConfigError as err:
            self._by_replica.pop(name, None)
            log.warning("%s; its pool's credential is sent instead", err)

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Reload (gateway/reload.py): read the new config's pool and static-replica credentials now
        (ConfigError, naming the setting, refuses the reload); the commit swaps them in. Replicas a
        discovery source brought keep theirs."""
        fresh = ReplicaCredentials.from_config(new, self._env)
        dropped = {r.display_name for r in old.replicas if r.has_credential} - set(fresh._by_replica)

        def commit() -> None:
            self._by_pool = fresh._by_pool
            for name in dropped:
                self._by_replica.pop(name, None)
            self._by_replica.update(fresh._by_replica)

        return ReloadStep(commit)

    def forget(self, name: str) -> None:
        self._by_replica.pop(name, None)

    def headers_for(self, replica: str, pool: str) -> tuple[Header, ...]:
        """The extra request header lines for `replica` of `pool` (empty: no credential)."""
        found = self._by_replica.get(replica)
        if found is not None:
            return found
        return self._by_pool.get(pool, _NONE)

    def __repr__(self) -> str:  # never the keys
        return f"ReplicaCredentials({len(self._by_replica)} replicas, {len(self._by_pool)} pools)"


def _header(source: ReplicaCredential, where: str, env: Mapping[str, str]) -> Header:
    if source.api_key_env is not None:
        value = env.get(source.api_key_env, "").strip()
        if not value:
            raise ConfigError(
                f"{where}.api_key_env: the environment variable {source.api_key_env} is unset or empty"
            )
    else:
        assert source.api_key_file is not None
        try:
            value = Path(source.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
            raise ConfigError(f"{where}.api_key_file: cannot read {source.api_key_file}: {reason}") from None
        if not value:
            raise ConfigError(f"{where}.api_key_file: {source.api_key_file} is empty")
    if any(c in value for c in "\r\n\0") or not value.isascii():
        raise ConfigError(f"{where}: the replica key holds characters a header cannot carry")
    return (b"authorization", b"Bearer " + value.encode("ascii"))
