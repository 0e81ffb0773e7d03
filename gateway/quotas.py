"""Quotas on the request path: which counters a request meets, what it asks of them, what it is told.

A `Quota` is one configured quota of a tenant, or of one of its keys, compiled once (a config load or
an admin change). Per request, `plan` picks the quotas whose `models` match the model the client
sent and gives each its counter for the current calendar window (`policies.quota_window`; the window
is kept and recomputed only when the wall clock leaves it) and the amount the request reserves:

- a `tokens` quota reserves what the token bucket reserves: prompt tokens + output cap; settled to the
  tokens the request is charged (`policies.charging`);
- a `requests` quota reserves 1; settled to 1, or 0 for a request that never reached a replica.

The counters ride in the rate limiter's one store call (`gateway/rate_limit.py`). What comes back:

- 429 `insufficient_quota` (OpenAI's type and code for a spent quota) naming the quota, with
  `Retry-After` = whole seconds until the window ends (the latest end among the refusing quotas);
- 400 `request_too_large` when the reservation is larger than the whole quota: no window helps;
- on every answer to a principal with quotas, `x-kvgate-quota-{name,limit,remaining,reset}` for the
  tightest quota (least remaining as a share of its limit): `remaining` after this request's
  reservation, `reset` in whole seconds until its window ends;
- crossing a quota's `warn_at` in a window: one log line and `kvgate_quota_warnings_total`, once per
  window across every gateway sharing the store (the counter remembers it).

A counter outlives its window by `GRACE_S`, so a request that started before midnight settles into
the window it was admitted in; one still running an hour after its window ended settles nothing into
it (the window is over; the usage ledger still records it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal
from zoneinfo import ZoneInfo

from gateway.config_tenancy import QuotaConfig
from gateway.errors import GatewayError
from gateway.stores.base import Counter
from policies.quota import remaining
from policies.quota_window import Period, Window, iso_local, window_at, zone
from policies.retry_after import retry_after_from_bucket
from policies.tenancy import ModelAllowList
from policies.types import RequestInfo

log = logging.getLogger("kvgate.quota")

GRACE_S = 3600.0
_YEAR_S = 366 * 86_400  # Retry-After cap: a month's window fits
_PER = {"day": "day", "week": "week (Monday to Sunday)", "month": "calendar month"}
Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True, eq=False)
class Quota:
    """One quota of `tenant` (`key` None) or of one of its keys, compiled once. `source` says where
    it was set ("config" or "api"). Holds its current window; one event loop."""

    tenant: str
    key: str | None
    name: str
    unit: Literal["tokens", "requests"]
    limit: int
    period: Period
    tz: ZoneInfo
    warn_at: float | None
    models: ModelAllowList | None
    config: QuotaConfig
    source: str = "config"
    _window: Window | None = field(default=None, repr=False)
    _counter: Counter | None = field(default=None, repr=False)
    header_bytes: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self.header_bytes = (
            (b"x-kvgate-quota-name", self.name.encode()),
            (b"x-kvgate-quota-limit", str(self.limit).encode()),
        )

    @classmethod
    def compile(cls, q: QuotaConfig, tenant: str, key: str | None, source: str = "config") -> Quota:
        return cls(
            tenant=tenant,
            key=key,
            name=q.display_name,
            unit=q.unit,
            limit=q.limit,
            period=q.per,
            tz=zone(q.timezone),
            warn_at=q.warn_at,
            models=ModelAllowList.compile(q.models) if q.models is not None else None,
            config=q,
            source=source,
        )

    def applies_to(self, model: str) -> bool:
        return self.models is None or self.models.allows(model)

    def counter(self, now: float) -> Counter:
        """The counter of the window holding `now` (Unix seconds)."""
        w = self._window
        if w is None or not w.start <= now < w.end or self._counter is None:
            w = self._window = window_at(self.period, self.tz, now)
            scope = "t" if self.key is None else f"k:{self.key}"
            warn = self.limit * self.warn_at if self.warn_at is not None else None
            self._counter = Counter(
                self.tenant, f"q:{scope}:{self.name}:{w.label}", self.limit, w.end + GRACE_S, warn
            )
        return self._counter

    def window(self, now: float) -> Window:
        self.counter(now)
        assert self._window is not None
        return self._window

    def amount(self, info: RequestInfo) -> float:
        return float(info.reserved_tokens) if self.unit == "tokens" else 1.0

    def charged(self, requests: int, tokens: int) -> float:
        return float(tokens) if self.unit == "tokens" else float(requests)

    @property
    def owner(self) -> str:
        return (
            f"tenant '{self.tenant}'" if self.key is None else f"key '{self.key}' of tenant '{self.tenant}'"
        )

    def describe(self) -> str:
        """`2000000 tokens per day (Europe/Berlin) for models llama-3-70b*`."""
        text = f"{self.limit} {self.unit} per {_PER[self.period]} ({self.tz.key})"
        if self.models is not None:
            text += f" for models {', '.join(self.config.models or ())}"
        return text


@dataclass(frozen=True, slots=True)
class QuotaPlan:
    """The quotas a request meets, their counters and the amounts it reserves, index for index."""

    quotas: tuple[Quota, ...]
    counters: tuple[Counter, ...]
    amounts: tuple[float, ...]


NO_PLAN = QuotaPlan((), (), ())


def plan(quotas: Sequence[Quota], info: RequestInfo, now: float) -> QuotaPlan:
    """The request's quotas at `now`, or raise 400 when its reservation exceeds a whole quota.
    One pass over the quotas: this runs on every request of a principal with quotas."""
    if not quotas:
        return NO_PLAN
    model = info.model
    tokens = float(info.reserved_tokens)
    picked: list[Quota] = []
    counters: list[Counter] = []
    amounts: list[float] = []
    for q in quotas:
        if q.models is not None and not q.models.allows(model):
            continue
        a = tokens if q.unit == "tokens" else 1.0
        if a > q.limit:
            raise GatewayError(
                400,
                f"Request too large for the quota '{q.name}' of {q.owner}: {q.describe()}, requested "
                f"{int(a)} ({info.prompt_tokens} prompt + {info.max_tokens} max output tokens). "
                "Reduce the prompt or max_tokens.",
                param="max_tokens",
                code="request_too_large",
            )
        picked.append(q)
        counters.append(q.counter(now))
        amounts.append(a)
    if not picked:
        return NO_PLAN
    return QuotaPlan(tuple(picked), tuple(counters), tuple(amounts))


def headers(p: QuotaPlan, used: Sequence[float], now: float, pick: int | None = None) -> Headers:
    """`x-kvgate-quota-*` for quota `pick`, or the tightest one (least remaining as a share)."""
    quotas = p.quotas
    if not quotas or len(used) != len(quotas):
        return []
    i = 0 if pick is None else pick
    if pick is None:
        least = 2.0
        for k, q in enumerate(quotas):
            share = (q.limit - used[k]) / q.limit
            if share < least:
                i, least = k, share
    q = quotas[i]
    return [
        *q.header_bytes,
        (b"x-kvgate-quota-remaining", str(math.floor(remaining(q.limit, used[i]))).encode()),
        (b"x-kvgate-quota-reset", str(math.ceil(q.window(now).reset_s(now))).encode()),
    ]


def refusal(
    p: QuotaPlan,
    used: Sequence[float],
    limiting: Sequence[int],
    now: float,
    bucket_retry_s: float,
    more: Headers,
) -> GatewayError:
    """The 429 for a request some quotas refused. Retry-After covers every refusing quota's window
    and, when buckets refused too, their refill."""
    last = max(limiting, key=lambda k: p.quotas[k].window(now).end)
    retry_s = max(bucket_retry_s, max(p.quotas[k].window(now).reset_s(now) for k in limiting))
    retry = retry_after_from_bucket(retry_s, cap_s=_YEAR_S)
    parts = []
    for k in limiting:
        q = p.quotas[k]
        parts.append(
            f"'{q.name}' of {q.owner} allows {q.describe()}; used {math.floor(used[k])}, requested "
            f"{int(p.amounts[k])}; it resets at {iso_local(q.window(now).end, q.tz)}"
        )
    return GatewayError(
        429,
        "Quota reached: " + "; ".join(parts) + f". Please try again in {retry}s.",
        code="insufficient_quota",
        type="insufficient_quota",
        headers=((b"retry-after", str(retry).encode()), *headers(p, used, now, last), *more),
    )


def report_crossing(q: Quota, used: float, now: float) -> None:
    """The once-per-window warning line (the caller counts the metric)."""
    assert q.warn_at is not None
    w = q.window(now)
    log.warning(
        "quota warning: %s has used %d of its quota '%s' (%s), over %d%%; window %s resets at %s",
        q.owner,
        used,
        q.name,
        q.describe(),
        round(q.warn_at * 100),
        w.label,
        iso_local(w.end, q.tz),
    )
