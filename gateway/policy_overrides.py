"""What the admin API changed, as data: keys it created or revoked, tenants' limits and quotas it set.

The config file stays the source of the tenants it names; these records are laid over it
(`gateway/tenants.py` compiles both) and persisted in the state store (`gateway/policy_store.py`) so
that they survive a restart and reach every gateway. Records are JSON in the store; each is validated
with the same config classes as the file, so a value the file would refuse is refused here too.

- `KeyRecord`, stored by key hash: a key created through the API (`source` "api", with its own limits
  and quotas), or a revocation of any key (`revoked_at` set; for a config key the record holds only
  who revoked it and when). A revoked key stays revoked even if the config still lists it.
- `TenantPatch`, stored by tenant name: `limits` fields set through the API (None = no limit) over
  the config's, and `quotas`, when set, replacing the config's list.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.config import TenantConfig, TenantLimits
from gateway.config_tenancy import NAME_PATTERN, KeyLimits, QuotaConfig


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyRecord(_Record):
    tenant: str
    name: str = Field(min_length=1, max_length=80)
    hash: str
    source: Literal["api", "config"] = "api"
    created_at: float | None = None
    created_by: str | None = None
    revoked_at: float | None = None
    revoked_by: str | None = None
    limits: KeyLimits = KeyLimits()
    quotas: tuple[QuotaConfig, ...] = ()

    @property
    def live(self) -> bool:
        return self.revoked_at is None

    def dumps(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json", exclude_defaults=True))


class TenantPatch(_Record):
    limits: dict[str, int | None] = Field(default_factory=dict)
    quotas: tuple[QuotaConfig, ...] | None = None
    updated_at: float | None = None
    updated_by: str | None = None

    def apply(self, t: TenantConfig) -> TenantConfig:
        """`t` with this patch laid over it (validated: raises pydantic's ValidationError)."""
        limits = TenantLimits.model_validate({**t.limits.model_dump(), **self.limits})
        quotas = self.quotas if self.quotas is not None else t.quotas
        return TenantConfig.model_validate(
            {**t.model_dump(), "limits": limits.model_dump(), "quotas": quotas}
        )

    @property
    def empty(self) -> bool:
        return not self.limits and self.quotas is None

    def dumps(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True))


class Overrides(_Record):
    """Everything the API changed, as one gateway last read it; `generation` counts the changes."""

    generation: int = 0
    keys: dict[str, KeyRecord] = Field(default_factory=dict)  # by key hash
    tenants: dict[str, TenantPatch] = Field(default_factory=dict)  # by tenant name

    def revoked(self, key_hash: str) -> bool:
        r = self.keys.get(key_hash)
        return r is not None and not r.live

    def api_keys_of(self, tenant: str) -> list[KeyRecord]:
        return [r for r in self.keys.values() if r.tenant == tenant and r.source == "api" and r.live]


NO_OVERRIDES = Overrides()


class PatchRequest(_Record):
    """The body of `PATCH /admin/tenants/{name}`."""

    limits: dict[str, int | None] | None = None
    quotas: tuple[QuotaConfig, ...] | None = None
    revert: tuple[str, ...] = ()  # "limits", "quotas" or "limits.<field>": back to the config's


class NewKeyRequest(_Record):
    """The body of `POST /admin/tenants/{name}/keys`."""

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    limits: KeyLimits = KeyLimits()
    quotas: tuple[QuotaConfig, ...] = ()


def loads_key(raw: bytes | str) -> KeyRecord:
    return KeyRecord.model_validate(orjson.loads(raw))


def loads_patch(raw: bytes | str) -> TenantPatch:
    return TenantPatch.model_validate(orjson.loads(raw))


def as_json(records: dict[str, Any]) -> dict[str, Any]:
    return {k: v.model_dump(mode="json", exclude_none=True) for k, v in records.items()}
