"""Fuzzed requests over loopback HTTP, with tenants: bodies, headers and raw bytes drawn by
hypothesis, most of them one change away from a valid request, sent to kvgate in front of a
simulated fleet with two tenants (one anonymous, tight limits, a TTFT SLO on the other). Every
answer is a success or an error in OpenAI's shape (never a 500), every stream that starts ends with
`[DONE]`, and afterwards nothing is left in flight or queued, for the pool or for either tenant.

`KVGATE_FUZZ_EXAMPLES` (default 200) sets how many requests are drawn: the suite's run is short, a
longer hunt is `KVGATE_FUZZ_EXAMPLES=4000 pytest tests/gateway/test_fuzz_requests_http.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.stack import MODEL, metric_value
from tests.gateway.tenancy_stack import key_of, tenancy_stack, tenant

EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "200"))

_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)  # past 64 bits too: the JSON parser must refuse, not overflow
    | st.floats()  # NaN and Infinity: not JSON, sent as Python's json writes them
    | st.text(max_size=12)
    | st.sampled_from([MODEL, f"{MODEL}:lora-x", "", " ", "nan", "1e309", "-1"])
)
_part = st.dictionaries(
    st.sampled_from(["type", "text", "image_url", "input_audio", "refusal"]),
    _scalar | st.dictionaries(st.sampled_from(["url", "detail"]), _scalar, max_size=2),
    max_size=3,
)
_message = st.dictionaries(
    st.sampled_from(["role", "content", "name", "tool_calls", "tool_call_id"]),
    _scalar
    | st.lists(_part, max_size=3)
    | st.sampled_from(["user", "system", "assistant", "tool", "developer"]),
    max_size=4,
)
_value = (
    _scalar
    | st.lists(_message, max_size=4)
    | st.lists(_scalar, max_size=4)
    | st.dictionaries(
        st.sampled_from(["include_usage", "continuous_usage_stats", "type"]), _scalar, max_size=2
    )
)
_fields = st.sampled_from([
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream", "n", "stream_options",
    "stop", "temperature", "top_p", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format",
    "user", "seed", "priority", "echo", "suffix", "best_of", "min_tokens", "ignore_eos", "logit_bias",
])  # fmt: skip
_printable = st.characters(min_codepoint=33, max_codepoint=126)  # what a header value may hold
_header_values = st.text(alphabet=_printable, max_size=20) | st.sampled_from(
    ["critical", "sheddable", "standard", "0", "-1", "1e9", "50", "5000", "Bearer", "Bearer sk-nobody",
     f"Bearer {key_of('a')}", f"Bearer {key_of('b')}", "application/json", "text/plain"]
)  # fmt: skip
_headers = st.dictionaries(
    st.sampled_from(["x-kvgate-priority", "x-kvgate-ttft-slo-ms", "authorization", "x-session-id",
                     "x-request-id", "content-type", "x-api-key"]),
    _header_values,
    max_size=3,
)  # fmt: skip

Case = tuple[str, bytes, dict[str, str], bool]  # path, body, headers, sent as a stream


def _cases(n: int) -> list[Case]:
    """`n` requests: a fifth raw bytes, the rest JSON; of those, two in three start from a valid
    request (streamed or not) and take one or all of the drawn fields over it."""
    out: list[Case] = []

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        drawn=st.dictionaries(_fields, _value, max_size=8),
        headers=_headers,
        chat=st.booleans(),
        shape=st.integers(0, 14),
        junk=st.binary(max_size=60),
    )
    def collect(drawn: dict[str, Any], headers: dict[str, str], chat: bool, shape: int, junk: bytes) -> None:
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if shape < 3:
            out.append((path, junk, headers, False))
            return
        body: dict[str, Any] = drawn
        if shape >= 5:
            body = {"model": MODEL, "max_tokens": 8, "stream": shape % 2 == 1}
            body.update({"messages": [{"role": "user", "content": "hello"}]} if chat else {"prompt": "hello"})
            body.update(dict(list(drawn.items())[:1]) if shape >= 10 else drawn)
        out.append((path, json.dumps(body).encode(), headers, body.get("stream") is True))

    collect()
    return out


@pytest.mark.timeout(240)
async def test_fuzzed_requests_with_tenants_never_500_never_hang_and_leave_nothing_behind() -> None:
    cases = _cases(EXAMPLES)
    cfg = {
        "tenants": [
            tenant("a", limits={"rpm": 6000, "tpm": 2_000_000}, slo={"ttft_s": 0.5}),
            tenant("b", priority="sheddable", limits={"rpm": 600, "tpm": 50_000}),
        ],
        "auth": {"anonymous_tenant": "b"},
    }
    failures: list[str] = []
    statuses: dict[int, int] = {}
    async with tenancy_stack(cfg, replicas=2) as s:
        gate = asyncio.Semaphore(16)

        async def send(path: str, body: bytes, headers: dict[str, str], stream: bool) -> None:
            async with gate:
                r = await asyncio.wait_for(s.client.post(path, content=body, headers=headers), 60)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            where = f"{path} {body[:300]!r} {headers}"
            if r.status_code >= 500 and r.status_code not in (502, 503, 504):
                failures.append(f"{r.status_code} {r.text[:200]} <- {where}")
            elif r.status_code >= 400:
                err = r.json().get("error")
                if not isinstance(err, dict) or not {"message", "type", "param", "code"} <= set(err):
                    failures.append(f"not OpenAI-shaped: {r.status_code} {r.text[:200]} <- {where}")
                elif err["code"] != r.status_code and not (r.status_code in (401, 403, 429) and err["code"]):
                    failures.append(f"code {err['code']!r} for {r.status_code} <- {where}")
            elif r.headers.get("content-type", "").startswith("text/event-stream"):
                if not r.text.rstrip().endswith("data: [DONE]"):
                    failures.append(f"stream without [DONE]: {r.text[-200:]!r} <- {where}")
            elif stream:
                failures.append(f"asked to stream, got {r.headers.get('content-type')} <- {where}")

        await asyncio.gather(*(send(*c) for c in cases))
        assert not failures, "\n".join(failures[:10])
        assert sum(statuses.values()) == len(cases)
        assert statuses.get(200, 0) > 0 and any(400 <= code < 500 for code in statuses), statuses
        for name in ("kvgate_requests_in_flight", "kvgate_queue_depth", "kvgate_tenant_in_flight"):
            assert await metric_value(s.client, name) == 0, name
        assert s.gateway.tenancy.admission.depth == 0
        assert (await s.client.get("/health")).status_code == 200
