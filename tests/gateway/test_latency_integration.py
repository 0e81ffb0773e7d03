"""Predicted latency over real loopback HTTP to the simulator: every streamed dispatch is predicted,
observed and calibrates its replica's model; the error histogram and the route header explain it."""

from __future__ import annotations

import asyncio

from tests.gateway.stack import MODEL, chat, metric_value, stack

PROMPT = "Summarise the quarterly ledger for the accounts team, line by line. " * 30


async def test_predictions_are_made_observed_and_exported() -> None:
    config = {
        "scheduling": {"profile": "predicted-latency"},
        "models": [{"name": MODEL, "latency_prior": {"profile": "tiny", "time_scale": 4.0}}],
    }
    async with stack(replicas=2, time_scale=4.0, config=config) as s:

        async def one(i: int) -> str:
            body = chat(f"{PROMPT} request {i}", max_tokens=8, stream=True)
            async with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                route = r.headers["x-kvgate-route"]
                async for _ in r.aiter_bytes():
                    pass
            return str(route)

        routes = [await one(i) for i in range(4)]
        routes += await asyncio.gather(*(one(i) for i in range(4, 12)))

        # The header names the winner's and the runner-up's predicted TTFT.
        for route in routes:
            fields = dict(part.split("=", 1) for part in route.split(";"))
            assert float(fields["ttft_ms"]) > 0
            assert fields["runner_up"] in ("r0", "r1") and fields["runner_up"] != fields["replica"]
            assert float(fields["runner_up_ttft_ms"]) > 0
            assert "predicted-latency" in fields

        # Every stream's first token was observed against its prediction, per replica and pool.
        name = "kvgate_ttft_prediction_error_ratio_count"
        counts = [await metric_value(s.client, name, {"replica": r, "pool": MODEL}) for r in ("r0", "r1")]
        assert sum(counts) == 12
        models = s.gateway.router.latency.models()
        # Fresh inputs (scrapes every 50 ms) calibrate; the ledger is empty once every answer ended.
        assert sum(m.ttft.observations for m in models.values()) > 0
        assert sum(m.tpot.observations for m in models.values()) > 0
        assert all(m.pending_tokens == 0 and m.pending_requests == 0 for m in models.values())


async def test_a_non_streaming_answer_leaves_the_ledger_without_calibrating() -> None:
    async with stack(replicas=1) as s:
        r = await s.client.post("/v1/chat/completions", json=chat(PROMPT, max_tokens=4))
        assert r.status_code == 200
        assert "ttft_ms=" in r.headers["x-kvgate-route"]
        m = s.gateway.router.latency.models()["r0"]
        assert (m.pending_requests, m.pending_tokens, m.ttft.observations) == (0, 0, 0)
        assert await metric_value(s.client, "kvgate_ttft_prediction_error_ratio_count") == 0
