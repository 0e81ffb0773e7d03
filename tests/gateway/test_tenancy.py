"""gateway/tenancy.py: what a finished request is charged (`charge_for`, over policies/charging.py),
and admit/settle bookkeeping on the memory store without a network."""

from __future__ import annotations

import asyncio

import pytest

from gateway import tenant_status
from gateway.auth_keys import hash_key
from gateway.config import parse_config
from gateway.errors import GatewayError
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.state import FleetState
from gateway.forwarder import Outcome
from gateway.metrics import GatewayMetrics
from gateway.sse_filter import Usage
from gateway.tenancy import Charge, Tenancy, charge_for
from policies.types import Band, RequestInfo
from tests.gateway.stores.fakes import FakeClock

INFO = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=40, max_tokens=100)


@pytest.mark.parametrize(
    ("usage", "outcome", "expected"),
    [
        (Usage(40, 7, 16), Outcome(status=200, attempts=1), Charge(1, 47, 40, 7, 16)),  # the replica's
        (Usage(40, 7), None, Charge(1, 47, 40, 7)),
        # the stream broke or the client left: prompt estimate + events, marked as an estimate
        (None, Outcome(status=200, attempts=1, events=5), Charge(1, 45, 40, 5, 0, True)),
        # ... never more output than the request reserved (max_tokens 100), whatever a replica sent
        (None, Outcome(status=200, attempts=1, events=5000), Charge(1, 140, 40, 100, 0, True)),
        (None, Outcome(status=0, attempts=1), Charge(1, 40, 40, 0, 0, True)),  # left during prefill
        (None, Outcome(status=0, attempts=2, error_kind="timeout"), Charge(0, 0)),  # all attempts failed
        (None, Outcome(status=400, attempts=1), Charge(1, 0)),  # the replica refused it
        (None, Outcome(), Charge(0, 0)),  # never dispatched
        (None, None, Charge(0, 0)),
    ],
)
def test_charge_for(usage: Usage | None, outcome: Outcome | None, expected: Charge) -> None:
    assert charge_for(INFO, usage, outcome) == expected


def tenancy(scrape: ReplicaMetrics | None = None, **cfg: object) -> Tenancy:
    config = parse_config({"replicas": [{"url": "http://r:1", "model": "m", "name": "r"}], **cfg})
    clock = FakeClock()
    fleet = FleetState(config.replicas, config.fleet, clock)
    fleet.record_scrape("r", scrape or ReplicaMetrics(running=0, waiting=0, kv_usage=0.0))
    return Tenancy(config, fleet, GatewayMetrics(), clock)


ACME = {
    "name": "acme",
    "api_keys": [hash_key("k")],
    "limits": {"rpm": 60, "tpm": 1000, "max_concurrency": 2},
    "priority": "standard",
}


async def test_open_gateway_admits_without_a_store() -> None:
    t = tenancy()
    assert t.limiter is None
    anon = t.authenticate(None)
    assert anon is t.authenticate(b"Bearer whatever")  # keys are not checked when there are no tenants
    adm = await t.admit(anon, INFO, None)
    assert adm.headers == [] and adm.reservation is None and adm.vllm_priority is None
    await t.settle(adm, Usage(40, 3), None)
    assert tenant_status.summary(t, anon)["used"] == {"requests": 1, "tokens": 43, "since": t.started_at}


async def test_priority_header_lowers_but_never_raises_and_unknown_is_400() -> None:
    t = tenancy(tenants=[ACME], flow_control={"pass_priority": True})
    acme = t.authenticate(b"Bearer k")
    adm = await t.admit(acme, INFO, b"sheddable")
    assert adm.info.band is Band.SHEDDABLE and adm.vllm_priority == 2
    adm2 = await t.admit(acme, INFO, b"critical")
    assert adm2.info.band is Band.STANDARD and adm2.vllm_priority == 1
    with pytest.raises(GatewayError) as err:
        await t.admit(acme, INFO, b"urgent")
    assert err.value.status == 400 and err.value.param == "x-kvgate-priority"


async def test_concurrency_limit_and_settle_frees_the_slot_once() -> None:
    t = tenancy(tenants=[ACME])
    acme = t.authenticate(b"Bearer k")
    a = await t.admit(acme, INFO, None)
    await t.admit(acme, INFO, None)
    with pytest.raises(GatewayError) as err:
        await t.admit(acme, INFO, None)
    assert err.value.status == 429 and dict(err.value.headers)[b"retry-after"] == b"1"
    await t.settle(a, Usage(40, 10), Outcome(status=200, attempts=1))
    await t.settle(a, Usage(40, 10), Outcome(status=200, attempts=1))  # idempotent
    assert tenant_status.summary(t, acme)["in_flight"] == 1
    await t.admit(acme, INFO, None)


async def test_reservation_and_settle_on_the_buckets() -> None:
    t = tenancy(tenants=[ACME])
    acme = t.authenticate(b"Bearer k")
    adm = await t.admit(acme, INFO, None)  # reserves 1 request and 140 tokens
    headers = dict(adm.headers)
    assert headers[b"x-ratelimit-limit-tokens"] == b"1000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"860"
    assert headers[b"x-ratelimit-remaining-requests"] == b"59"
    await t.settle(adm, Usage(40, 7), Outcome(status=200, attempts=1))
    status = await tenant_status.status(t, acme)
    assert status["buckets"]["tokens"]["level"] == 1000 - 47  # the fake clock did not move
    assert status["buckets"]["requests"]["level"] == 59
    assert status["store"] == "memory"


async def test_a_request_that_never_ran_gets_everything_back() -> None:
    t = tenancy(tenants=[ACME])
    acme = t.authenticate(b"Bearer k")
    adm = await t.admit(acme, INFO, None)
    await t.settle(adm, None, Outcome())  # e.g. routing found no replica
    status = await tenant_status.status(t, acme)
    assert status["buckets"]["tokens"]["level"] == 1000 and status["buckets"]["requests"]["level"] == 60


async def test_a_request_shed_by_flow_control_gets_its_reservation_back_and_says_so() -> None:
    t = tenancy(ReplicaMetrics(running=300, waiting=500, kv_usage=1.0), tenants=[ACME])  # saturated
    acme = t.authenticate(b"Bearer k")
    with pytest.raises(GatewayError) as err:
        await t.admit(acme, INFO, b"sheddable")  # refused at once while saturated
    headers = dict(err.value.headers)
    assert err.value.status == 503 and int(headers[b"retry-after"]) >= 1
    # The limits as they stand after the refund: nothing of this request is counted.
    assert headers[b"x-ratelimit-limit-tokens"] == b"1000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"1000"
    assert headers[b"x-ratelimit-remaining-requests"] == b"60"
    assert headers[b"x-ratelimit-reset-tokens"] == b"0s"
    await asyncio.sleep(0)  # the background refund
    status = await tenant_status.status(t, acme)
    assert status["buckets"]["tokens"]["level"] == 1000 and status["buckets"]["requests"]["level"] == 60
