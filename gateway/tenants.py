"""The tenants of the config, and who a presented API key belongs to.

Keys are stored only as `sha256:<hex>` hashes (`kvgate hash-key` prints one). A presented key is
hashed once, then looked up: the dict finds the candidate by the digest and `hmac.compare_digest`
confirms it in constant time. The lookup's own timing can only tell an attacker about the DIGEST of
keys they chose, and learning digests of stored keys gives no key (that would need a SHA-256
preimage), so the key itself never leaks through timing. No key, hashed or not, is ever part of a
`Tenant`, a log line, a metric label or an error message.

With no tenants configured the gateway is open: every request, with or without a key, runs as an
unlimited anonymous tenant (the embedded `kvgate up` needs no keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.auth_keys import hash_key, same_hash
from gateway.config import Config, TenantConfig
from gateway.stores.base import Bucket
from policies.tenancy import ModelAllowList
from policies.token_bucket import BucketSpec
from policies.types import Band

ANONYMOUS = "anonymous"
_EVERY_MODEL = ModelAllowList.compile(None)


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's policy, compiled once from config. `requests`/`tokens` are its bucket limits
    (None: unlimited); `max_concurrency` is what THIS gateway enforces (the configured value split
    over `state.gateways` when limits are shared through Redis); `max_output_tokens` is the output
    cap reserved when a request gives no `max_tokens`."""

    name: str
    band: Band = Band.STANDARD
    weight: float = 1.0
    max_output_tokens: int = 4096
    max_concurrency: int | None = None
    requests: Bucket | None = None
    tokens: Bucket | None = None
    models: ModelAllowList = field(default=_EVERY_MODEL)
    rpm: int | None = None  # the configured per-minute limits, for messages
    tpm: int | None = None
    buckets: tuple[Bucket, ...] = ()  # requests and/or tokens, in that order (built once)

    @property
    def limited(self) -> bool:
        return bool(self.buckets)


def compile_tenant(t: TenantConfig, concurrency_share: int = 1) -> Tenant:
    lim = t.limits
    requests = tokens = None
    if lim.rpm is not None:
        requests = Bucket(t.name, "requests", BucketSpec.per_minute(lim.rpm, lim.rpm_burst))
    if lim.tpm is not None:
        tokens = Bucket(t.name, "tokens", BucketSpec.per_minute(lim.tpm, lim.tpm_burst))
    concurrency = lim.max_concurrency
    if concurrency is not None:
        concurrency = max(1, math.ceil(concurrency / concurrency_share))
    return Tenant(
        name=t.name,
        band=Band.parse(t.priority),
        weight=t.weight,
        max_output_tokens=lim.max_output_tokens,
        max_concurrency=concurrency,
        requests=requests,
        tokens=tokens,
        models=ModelAllowList.compile(t.models),
        rpm=lim.rpm,
        tpm=lim.tpm,
        buckets=tuple(b for b in (requests, tokens) if b is not None),
    )


class TenantRegistry:
    """Tenants by name and by key hash; admin key hashes. Immutable after construction."""

    def __init__(self, config: Config) -> None:
        shared = config.state.store != "memory://"
        share = config.state.gateways if shared else 1
        self.tenants: tuple[Tenant, ...] = tuple(compile_tenant(t, share) for t in config.tenants)
        self._by_name = {t.name: t for t in self.tenants}
        self._by_hash: dict[str, tuple[str, Tenant]] = {}
        for tc in config.tenants:
            for h in tc.api_keys:
                self._by_hash[h] = (h, self._by_name[tc.name])
        self._admin = frozenset(k if isinstance(k, str) else k.hash for k in config.auth.admin_keys)
        self.open = not self.tenants
        anon = config.auth.anonymous_tenant
        # Who a request without a key runs as: nobody (401), the named tenant, or (open gateway) an
        # unlimited anonymous tenant.
        self.keyless: Tenant | None = (
            Tenant(ANONYMOUS) if self.open else (self._by_name[anon] if anon is not None else None)
        )

    def get(self, name: str) -> Tenant | None:
        return self._by_name.get(name)

    def by_key(self, key: str) -> Tenant | None:
        """The tenant owning `key` (the plain key as presented), or None."""
        h = hash_key(key)
        entry = self._by_hash.get(h)
        if entry is None:
            return None
        stored, tenant = entry
        # The dict compared digests with ==; confirm in constant time all the same.
        return tenant if same_hash(stored, h) else None

    def is_admin(self, key: str) -> bool:
        h = hash_key(key)
        found = False
        for stored in self._admin:  # few admin keys: compare with every one, no early exit
            found |= same_hash(stored, h)
        return found

    @property
    def admin_enabled(self) -> bool:
        return bool(self._admin)

    @property
    def any_limits(self) -> bool:
        return any(t.limited for t in self.tenants)
