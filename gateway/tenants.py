"""The tenants of the config (with the admin API's changes laid over them), and who a presented API
key belongs to.

Keys are stored only as `sha256:<hex>` hashes (`kvgate hash-key` prints one). A presented key is
hashed once, then looked up: the dict finds the candidate by the digest and `hmac.compare_digest`
confirms it in constant time. The lookup's own timing can only tell an attacker about the DIGEST of
keys they chose, and learning digests of stored keys gives no key (that would need a SHA-256
preimage), so the key itself never leaks through timing. No key, hashed or not, is ever part of a
`Tenant`, a log line, a metric label or an error message.

Keys are sub-principals. Each key of a tenant — from `api_keys` (unnamed), from `keys:` (named, with
its own limits and quotas) or created through the admin API — resolves to its own `Tenant` value: the
tenant's policy with `key` set and the key's buckets and quotas added to the tenant's, so that both
must pass. A key's identity in the ledger and in metrics is its name, or `unnamed-<first 8 hex digits
of its hash>` for a key given by hash only (never the key, never its full hash).

With no tenants configured the gateway is open: every request, with or without a key, runs as an
unlimited anonymous tenant (the embedded `kvgate up` needs no keys).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gateway.auth_keys import hash_key, same_hash
from gateway.config import Config, TenantConfig
from gateway.config_tenancy import UNNAMED_KEY_PREFIX, KeyLimits, QuotaConfig
from gateway.policy_overrides import NO_OVERRIDES, KeyRecord, Overrides
from gateway.quotas import Quota
from gateway.stores.base import Bucket
from policies.latency_admission import NO_SLO, LatencySlo
from policies.tenancy import ModelAllowList
from policies.token_bucket import BucketSpec
from policies.types import Band

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
NO_KEY = "-"  # the key label of requests without a key (anonymous tenant, open gateway)
_EVERY_MODEL = ModelAllowList.compile(None)


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """One key of a tenant: `name` (its label), where it comes from (`source`: "config" or "api"),
    and its own limits: buckets (named `k:<name>:<kind>`), quotas and `max_concurrency` (per gateway,
    split like the tenant's)."""

    name: str
    source: str = "config"
    buckets: tuple[Bucket, ...] = ()
    quotas: tuple[Quota, ...] = ()
    max_concurrency: int | None = None
    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's policy, compiled once from config, as it applies to one of its keys (`key`; None
    for the tenant itself and for keyless requests). `requests`/`tokens` are the tenant's bucket limits
    (None: unlimited); `buckets` and `quotas` hold the tenant's AND the key's, all of which must
    pass; `max_concurrency` is what THIS gateway process enforces (the configured value split over
    `state.gateways` x `server.workers` processes when limits are shared through Redis);
    `max_output_tokens` is the output cap reserved when a request gives no `max_tokens`."""

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
    quotas: tuple[Quota, ...] = ()
    key: KeyPolicy | None = None
    slo: LatencySlo = NO_SLO  # `tenants[].slo`: tightens the latency gate

    @property
    def limited(self) -> bool:
        return bool(self.buckets) or bool(self.quotas)

    @property
    def key_label(self) -> str:
        return self.key.name if self.key is not None else NO_KEY

    @property
    def tenant_buckets(self) -> tuple[Bucket, ...]:
        return tuple(b for b in self.buckets if b.key is None)


def _share(concurrency: int | None, share: int) -> int | None:
    return None if concurrency is None else max(1, math.ceil(concurrency / share))


def _buckets(tenant: str, rpm: int | None, rpm_burst: int | None, tpm: int | None, tpm_burst: int | None,
             key: str | None = None) -> tuple[Bucket | None, Bucket | None]:  # fmt: skip
    requests = tokens = None
    if rpm is not None:
        requests = Bucket(tenant, "requests", BucketSpec.per_minute(rpm, rpm_burst), key)
    if tpm is not None:
        tokens = Bucket(tenant, "tokens", BucketSpec.per_minute(tpm, tpm_burst), key)
    return requests, tokens


def compile_tenant(t: TenantConfig, concurrency_share: int = 1, quota_source: str = "config") -> Tenant:
    lim = t.limits
    requests, tokens = _buckets(t.name, lim.rpm, lim.rpm_burst, lim.tpm, lim.tpm_burst)
    return Tenant(
        name=t.name,
        band=Band.parse(t.priority),
        weight=t.weight,
        max_output_tokens=lim.max_output_tokens,
        max_concurrency=_share(lim.max_concurrency, concurrency_share),
        requests=requests,
        tokens=tokens,
        models=ModelAllowList.compile(t.models),
        rpm=lim.rpm,
        tpm=lim.tpm,
        buckets=tuple(b for b in (requests, tokens) if b is not None),
        quotas=tuple(Quota.compile(q, t.name, None, quota_source) for q in t.quotas),
        slo=t.slo.slo(),
    )


def compile_key(tenant: str, name: str, limits: KeyLimits, quotas: Iterable[QuotaConfig], source: str,
                concurrency_share: int = 1) -> KeyPolicy:  # fmt: skip
    requests, tokens = _buckets(tenant, limits.rpm, limits.rpm_burst, limits.tpm, limits.tpm_burst, name)
    return KeyPolicy(
        name=name,
        source=source,
        buckets=tuple(b for b in (requests, tokens) if b is not None),
        quotas=tuple(Quota.compile(q, tenant, name, source) for q in quotas),
        max_concurrency=_share(limits.max_concurrency, concurrency_share),
        rpm=limits.rpm,
        tpm=limits.tpm,
    )


def unnamed_label(key_hash: str, digits: int = 8) -> str:
    return UNNAMED_KEY_PREFIX + key_hash.removeprefix("sha256:")[:digits]


def as_principal(base: Tenant, key: KeyPolicy) -> Tenant:
    return replace(base, key=key, buckets=base.buckets + key.buckets, quotas=base.quotas + key.quotas)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """A live key as the admin API lists it (no hash: only its label)."""

    tenant: str
    principal: Tenant
    record: KeyRecord | None  # the API's record (created_at/by), None for a config key


class TenantRegistry:
    """Tenants by name, principals by key hash, admin keys. Immutable after construction: a change
    through the admin API builds a new registry and the gateway swaps it in whole."""

    def __init__(self, config: Config, overrides: Overrides = NO_OVERRIDES) -> None:
        share = config.limit_processes
        self.config = config
        self.overrides = overrides
        tenants: list[Tenant] = []
        self._by_hash: dict[str, tuple[str, Tenant]] = {}
        self._keys: dict[str, dict[str, tuple[str, KeyEntry]]] = {}  # tenant -> label -> (hash, entry)
        for tc in config.tenants:
            patch = overrides.tenants.get(tc.name)
            source = "config"
            if patch is not None:
                try:
                    tc = patch.apply(tc)
                    source = "api" if patch.quotas is not None else "config"
                except ValueError as err:  # a stored patch the current config cannot take
                    log.error(
                        "tenant %r: the admin API's changes no longer apply (%s); using the config",
                        tc.name,
                        err,
                    )
            base = compile_tenant(tc, share, source)
            tenants.append(base)
            self._keys[tc.name] = {}
            for h in tc.api_keys:
                self._add_key(h, base, KeyPolicy(self._label(tc.name, h)), None)
            for k in tc.keys:
                self._add_key(
                    k.hash, base, compile_key(tc.name, k.name, k.limits, k.quotas, "config", share), None
                )
            for r in overrides.api_keys_of(tc.name):
                self._add_key(r.hash, base, compile_key(tc.name, r.name, r.limits, r.quotas, "api", share), r)
        self.tenants: tuple[Tenant, ...] = tuple(tenants)
        self._by_name = {t.name: t for t in self.tenants}
        self._admin: dict[str, str] = {}  # hash -> name
        for a in config.auth.admin_keys:
            h = a if isinstance(a, str) else a.hash
            self._admin[h] = unnamed_label(h) if isinstance(a, str) else a.name
        self.open = not self.tenants
        anon = config.auth.anonymous_tenant
        # Who a request without a key runs as: nobody (401), the named tenant, or (open gateway) an
        # unlimited anonymous tenant.
        self.keyless: Tenant | None = (
            Tenant(ANONYMOUS) if self.open else (self._by_name[anon] if anon is not None else None)
        )

    def _label(self, tenant: str, key_hash: str) -> str:
        digits = 8
        while unnamed_label(key_hash, digits) in self._keys[tenant] and digits < 64:
            digits += 4  # two unnamed keys sharing 8 leading digits: rare, but labels must differ
        return unnamed_label(key_hash, digits)

    def _add_key(self, key_hash: str, base: Tenant, key: KeyPolicy, record: KeyRecord | None) -> None:
        if self.overrides.revoked(key_hash) or key_hash in self._by_hash:
            return  # revoked through the API (even if the config still lists it); or listed twice
        if key.name in self._keys[base.name]:
            log.warning(
                "tenant %r has two live keys named %r; their usage shares one ledger row", base.name, key.name
            )
        principal = as_principal(base, key)
        self._by_hash[key_hash] = (key_hash, principal)
        self._keys[base.name][key.name] = (key_hash, KeyEntry(base.name, principal, record))

    def get(self, name: str) -> Tenant | None:
        return self._by_name.get(name)

    def by_key(self, key: str) -> Tenant | None:
        """The principal owning `key` (the plain key as presented), or None."""
        h = hash_key(key)
        entry = self._by_hash.get(h)
        if entry is None:
            return None
        stored, tenant = entry
        # The dict compared digests with ==; confirm in constant time all the same.
        return tenant if same_hash(stored, h) else None

    def keys_of(self, tenant: str) -> list[KeyEntry]:
        return [entry for _, entry in self._keys.get(tenant, {}).values()]

    def key_hash(self, tenant: str, label: str) -> str | None:
        """The hash of `tenant`'s live key `label` (for revoking it), or None."""
        found = self._keys.get(tenant, {}).get(label)
        return found[0] if found is not None else None

    def admin_name(self, key: str) -> str | None:
        """Who `key` is as an admin (its configured name, or `unnamed-<hex>`), or None."""
        h = hash_key(key)
        found: str | None = None
        for stored, name in self._admin.items():  # few admin keys: compare with every one, no early exit
            if same_hash(stored, h):
                found = name
        return found

    def is_admin(self, key: str) -> bool:
        return self.admin_name(key) is not None

    @property
    def admin_enabled(self) -> bool:
        return bool(self._admin)

    @property
    def any_limits(self) -> bool:
        return any(t.limited for t in self.tenants) or any(
            e.principal.limited for keys in self._keys.values() for _, e in keys.values()
        )
