"""gateway/quotas.py: which quotas a request meets, its counters per window (kept until the clock
leaves the window), 400 for a request larger than a quota, the headers and the 429."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.config import QuotaConfig
from gateway.errors import GatewayError
from gateway.quotas import GRACE_S, Quota, headers, plan, refusal
from policies.types import RequestInfo

INFO = RequestInfo(
    model="llama-3-70b", base_model="llama-3-70b", adapter=None, prompt_tokens=100, max_tokens=50
)
NOW = datetime(2026, 12, 3, 22, 0, tzinfo=UTC).timestamp()  # 23:00 in Berlin


def quota(key: str | None = None, **q: object) -> Quota:
    return Quota.compile(QuotaConfig.model_validate({"per": "day", **q}), "acme", key)


def test_counters_name_the_scope_quota_and_window_and_are_kept_within_the_window() -> None:
    q = quota(tokens=1000, timezone="Europe/Berlin", warn_at=0.8)
    c = q.counter(NOW)
    assert c.name == "q:t:tokens-per-day:2026-12-03" and c.tenant == "acme" and c.limit == 1000
    assert c.expires_at == datetime(2026, 12, 3, 23, 0, tzinfo=UTC).timestamp() + GRACE_S
    assert c.warn_level == 800
    assert q.counter(NOW + 3599) is c  # the same window: nothing recomputed
    assert q.counter(NOW + 3600).name == "q:t:tokens-per-day:2026-12-04"
    k = quota("ci-bot", requests=5, per="month")
    assert (
        k.counter(NOW).name == "q:k:ci-bot:requests-per-month:2026-12" and k.counter(NOW).warn_level is None
    )


def test_plan_picks_the_quotas_for_the_model_and_their_amounts() -> None:
    tokens = quota(tokens=1000, models=["llama-3-70b*"])
    requests = quota(requests=10)
    other = quota(tokens=5, models=["mistral-*"], name="mistral")
    p = plan([tokens, requests, other], INFO, NOW)
    assert p.quotas == (tokens, requests) and p.amounts == (150.0, 1.0)
    assert plan([other], INFO, NOW).quotas == ()
    assert plan([], INFO, NOW).quotas == ()


def test_a_request_larger_than_a_whole_quota_is_a_400() -> None:
    with pytest.raises(GatewayError) as err:
        plan([quota(tokens=149, name="small")], INFO, NOW)
    e = err.value
    assert e.status == 400 and e.code == "request_too_large" and e.param == "max_tokens"
    assert (
        "'small' of tenant 'acme'" in e.message and "requested 150 (100 prompt + 50 max output" in e.message
    )


def test_headers_show_the_tightest_quota_and_the_429_the_last_to_reset() -> None:
    day = quota(tokens=1000, timezone="Europe/Berlin")
    month = quota(requests=10, per="month", timezone="Europe/Berlin")
    p = plan([day, month], INFO, NOW)
    h = dict(headers(p, [900.0, 2.0], NOW))  # 10 % of the day left, 80 % of the month
    assert h == {b"x-kvgate-quota-name": b"tokens-per-day", b"x-kvgate-quota-limit": b"1000",
                 b"x-kvgate-quota-remaining": b"100", b"x-kvgate-quota-reset": b"3600"}  # fmt: skip
    err = refusal(p, [990.0, 10.0], [0, 1], NOW, 0.0, [])
    hh = dict(err.headers)
    month_end = datetime(2026, 12, 31, 23, 0, tzinfo=UTC).timestamp()
    assert err.status == 429 and err.type == "insufficient_quota" and err.code == "insufficient_quota"
    assert hh[b"retry-after"] == str(int(month_end - NOW)).encode()  # every refusing window must end
    assert hh[b"x-kvgate-quota-name"] == b"requests-per-month" and hh[b"x-kvgate-quota-remaining"] == b"0"
    assert "'tokens-per-day' of tenant 'acme'" in err.message and "'requests-per-month'" in err.message
    assert "resets at 2027-01-01T00:00:00+01:00" in err.message
