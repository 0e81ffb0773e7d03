"""The config sections for quotas, named keys, named admin keys and the usage ledger.

Part of `gateway.config` (which re-exports them), kept apart so that one module stays one size:
the same strict rules (unknown keys refused, errors with the field's dotted path and the reason).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"  # tenants, keys, quotas: they appear in metrics, keys and messages
UNNAMED_KEY_PREFIX = "unnamed-"  # labels of keys given by hash only; no name may start with it
MAX_QUOTA = 10**15  # counters are doubles: whole numbers stay exact far beyond this


def check_key_hash(k: str) -> str:
    hexpart = k.removeprefix("sha256:")
    if not k.startswith("sha256:") or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ValueError("api keys are stored hashed: 'sha256:' + 64 lowercase hex digits")
    return k


class QuotaConfig(_Strict):
    """`tokens` or `requests` per calendar `per` window in `timezone` (see policies/quota_window).
    `models` scopes it to requests for matching model names (shell-style patterns, as `models`)."""

    name: str | None = Field(None, min_length=1, max_length=64, pattern=NAME_PATTERN)
    tokens: int | None = Field(None, gt=0, le=MAX_QUOTA)
    requests: int | None = Field(None, gt=0, le=MAX_QUOTA)
    per: Literal["day", "week", "month"]
    timezone: str = "UTC"
    warn_at: float | None = Field(None, gt=0, lt=1)  # a fraction of the limit: metric + log, once
    models: tuple[str, ...] | None = None

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        from policies.quota_window import zone

        zone(v)  # raises ValueError naming it
        return v

    @field_validator("models")
    @classmethod
    def _globs(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("an empty list would match no model; leave `models` out to count every model")
        for p in v:
            if not p.strip() or p != p.strip():
                raise ValueError(f"model pattern {p!r} is empty or has surrounding spaces")
        return v

    @model_validator(mode="after")
    def _one_unit(self) -> QuotaConfig:
        if (self.tokens is None) == (self.requests is None):
            raise ValueError("a quota counts either `tokens` or `requests` (exactly one of them)")
        return self

    @property
    def unit(self) -> Literal["tokens", "requests"]:
        return "tokens" if self.tokens is not None else "requests"

    @property
    def limit(self) -> int:
        n = self.tokens if self.tokens is not None else self.requests
        assert n is not None
        return n

    @property
    def display_name(self) -> str:
        """`name`, or `<unit>-per-<per>` with the model patterns: `tokens-per-day[llama-3-70b*]`."""
        if self.name is not None:
            return self.name
        scope = f"[{','.join(self.models)}]" if self.models is not None else ""
        return f"{self.unit}-per-{self.per}{scope}"


def unique_quota_names(quotas: tuple[QuotaConfig, ...]) -> tuple[QuotaConfig, ...]:
    names = [q.display_name for q in quotas]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"two quotas are both named {dup}: give them distinct `name`s")
    return quotas


class KeyLimits(_Strict):
    """A key's own limits, in addition to its tenant's (both must pass)."""

    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    rpm_burst: int | None = Field(None, ge=1)
    tpm_burst: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)


class KeyConfig(_Strict):
    """A named key of a tenant: a sub-principal with its own limits and quotas, and its own rows in
    the usage ledger. The plain key is never in the config, only its hash."""

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    hash: str
    limits: KeyLimits = KeyLimits()
    quotas: tuple[QuotaConfig, ...] = ()

    @field_validator("hash")
    @classmethod
    def _hashed(cls, v: str) -> str:
        return check_key_hash(v)

    @field_validator("quotas")
    @classmethod
    def _quota_names(cls, v: tuple[QuotaConfig, ...]) -> tuple[QuotaConfig, ...]:
        return unique_quota_names(v)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v.startswith(UNNAMED_KEY_PREFIX):
            raise ValueError(f"names starting with {UNNAMED_KEY_PREFIX!r} label keys given without a name")
        return v


class AdminKeyConfig(_Strict):
    """An admin key with a name: the name is who made an admin call, in the audit log."""

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    hash: str

    @field_validator("hash")
    @classmethod
    def _hashed(cls, v: str) -> str:
        return check_key_hash(v)


class LedgerConfig(_Strict):
    """The usage ledger (gateway/ledger.py): per tenant x key x model x hour, kept in `state.store`."""

    enabled: bool = True
    flush_interval_s: float = Field(1.0, gt=0, le=60)  # settled usage is written this often...
    flush_max_records: int = Field(1000, ge=1)  # ...or once this many requests have settled
    retention_days: int = Field(400, ge=1)  # hours older than this expire from the store
