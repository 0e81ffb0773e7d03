"""Fuzzed admin calls over loopback HTTP: tenant patches, new keys, route weights, drains and usage
queries drawn by hypothesis (most near a valid change), sent with the admin key to kvgate in front
of a simulated fleet. Every answer is a success or an error in OpenAI's shape (never a 500), and
afterwards every read endpoint still answers and the tenants' requests are still served or refused
in that shape: no change the API accepts can leave the gateway broken.

`KVGATE_FUZZ_EXAMPLES` (default 200) sets how many calls are drawn, as for the request fuzz.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.auth_keys import hash_key
from tests.gateway.ab_stack import ADMIN, V2, route
from tests.gateway.stack import MODEL, chat, wait_for
from tests.gateway.tenancy_stack import auth, tenancy_stack, tenant

EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "200"))

_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-3, 10**6)
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from(["day", "week", "month", "UTC", "Europe/Paris", "Mars/Base", "*", "ci-bot", "acme"])
)
_limits = st.dictionaries(
    st.sampled_from(["rpm", "tpm", "max_in_flight", "burst_seconds", "weight", "rps", "x"]),
    _scalar,
    max_size=3,
)
_quota = st.dictionaries(
    st.sampled_from(["name", "tokens", "requests", "per", "timezone", "models"]),
    _scalar | st.lists(_scalar, max_size=2),
    max_size=5,
)
_body = st.dictionaries(
    st.sampled_from(["limits", "quotas", "revert", "name", "weights", "x"]),
    _scalar
    | _limits
    | st.lists(_quota, max_size=2)
    | st.lists(st.sampled_from(["limits", "quotas", "limits.rpm", "limits.nope", "x"]), max_size=2)
    | st.dictionaries(st.sampled_from([MODEL, V2, "nope"]), _scalar, max_size=3),
    max_size=4,
)
_name = st.sampled_from(["acme", "globex", "nobody", "chat", "r0", "r1", "x" * 70, "%2e%2e", "a b"])
_query = st.dictionaries(
    st.sampled_from(["tenant", "key", "model", "from", "to", "tz", "group_by", "format", "dims"]),
    st.text(max_size=12) | st.sampled_from(["acme", "day", "month", "csv", "json", "2026-01-01", "UTC"]),
    max_size=4,
)

Call = tuple[str, str, bytes | None, dict[str, str] | None]  # method, path, body, query


def _calls(n: int) -> list[Call]:
    out: list[Call] = []

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(which=st.integers(0, 8), name=_name, body=_body, query=_query, raw=st.binary(max_size=40))
    def collect(which: int, name: str, body: dict[str, Any], query: dict[str, str], raw: bytes) -> None:
        data = json.dumps(body).encode() if len(raw) % 4 else raw
        if which == 0:
            out.append(("PATCH", f"/admin/tenants/{name}", data, None))
        elif which == 1:
            out.append(("POST", f"/admin/tenants/{name}/keys", data, None))
        elif which == 2:
            out.append(("PUT", f"/admin/routes/{name}", data, None))
        elif which == 3:
            out.append(("POST" if len(raw) % 2 else "DELETE", f"/admin/replicas/{name}/drain", None, None))
        elif which == 4:
            out.append(("GET", "/admin/usage", None, query))
        elif which == 5:  # one field of a valid patch changed
            out.append(
                ("PATCH", "/admin/tenants/acme", json.dumps({"limits": {"rpm": 600}, **body}).encode(), None)
            )
        elif which == 6:  # a new key, its other fields drawn (a repeated name is a 409)
            new = {"name": f"k{len(raw) % 7}", **{k: v for k, v in body.items() if k != "name"}}
            out.append(("POST", "/admin/tenants/acme/keys", json.dumps(new).encode(), None))
        elif which == 7:  # a weight change, partly drawn
            weights = {"weights": {MODEL: 1, V2: 1}, **body}
            out.append(("PUT", "/admin/routes/chat", json.dumps(weights).encode(), None))
        else:
            out.append(("GET", f"/admin/tenants/{name}", None, None))

    collect()
    return out


@pytest.mark.timeout(240)
async def test_fuzzed_admin_calls_never_500_and_never_leave_the_gateway_broken() -> None:
    cfg = {
        "tenants": [
            tenant("acme", limits={"rpm": 600}, keys=[{"name": "ci-bot", "hash": hash_key("sk-ci")}]),
            tenant("globex"),
        ],
        "routes": [route()],
        "auth": {"admin_keys": [hash_key("sk-admin-secret")]},
    }
    failures: list[str] = []
    statuses: dict[int, int] = {}
    async with tenancy_stack(cfg, max_loras=2, adapters=("chat-v2",)) as s:
        c = s.client
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        for method, path, body, query in _calls(EXAMPLES):
            r = await c.request(method, path, content=body, params=query, headers=ADMIN)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            where = f"{method} {path} {body!r:.300} {query}"
            if r.status_code >= 500:
                failures.append(f"{r.status_code} {r.text[:200]} <- {where}")
            elif r.status_code >= 400:
                err = (
                    r.json().get("error")
                    if r.headers.get("content-type", "").startswith("application/json")
                    else None
                )
                if not isinstance(err, dict) or not {"message", "type", "param", "code"} <= set(err):
                    failures.append(f"not OpenAI-shaped: {r.status_code} {r.text[:200]} <- {where}")
        assert not failures, "\n".join(failures[:10])
        assert any(200 <= code < 300 for code in statuses) and any(400 <= code < 500 for code in statuses), (
            statuses
        )
        for name in ("r0", "r1"):  # whatever the drains left, put both back
            assert (await c.delete(f"/admin/replicas/{name}/drain", headers=ADMIN)).status_code == 200
        for path in ("/admin/tenants", "/admin/tenants/acme", "/admin/tenants/acme/keys", "/admin/replicas",
                     "/admin/pools", "/admin/routes", "/admin/usage", "/metrics", "/ready"):  # fmt: skip
            r = await c.get(path, headers=ADMIN)
            assert r.status_code == 200, (path, r.text[:300])
        for headers in (auth("acme"), auth("globex"), {"authorization": "Bearer sk-ci"}):
            for model in (MODEL, "chat"):
                r = await c.post("/v1/chat/completions", json=chat("hi", model=model), headers=headers)
                # served, or refused by a limit or quota the fuzz set: never broken
                assert r.status_code in (200, 429), (headers, model, r.status_code, r.text[:300])
