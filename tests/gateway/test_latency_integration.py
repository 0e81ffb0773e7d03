"""Predicted latency over real loopback HTTP to the simulator: every streamed dispatch is predicted,
observed and calibrates its replica's model; the error histogram and the route header explain it."""

from __future__ import annotations

import asyncio

from simulator.engine import StepResult
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

        # The header names the winner's and the runner-up's predicted TTFT. The runner-up is the best
        # of the other candidates the filters kept: the concurrent ones share a long prompt, and once
        # more than 4 of them are in flight on one replica `prefix-spread` keeps only the other one.
        for i, route in enumerate(routes):
            fields = dict(part.split("=", 1) for part in route.split(";"))
            assert float(fields["ttft_ms"]) > 0
            assert "predicted-latency" in fields
            if i < 4 or "runner_up" in fields:
                assert fields["runner_up"] in ("r0", "r1") and fields["runner_up"] != fields["replica"]
                assert float(fields["runner_up_ttft_ms"]) > 0
            else:
                assert "runner_up_ttft_ms" not in fields

        # Every stream's first token was observed against its prediction, per replica and pool.
        name = "kvgate_ttft_prediction_error_ratio_count"
        counts = [await metric_value(s.client, name, {"replica": r, "pool": MODEL}) for r in ("r0", "r1")]
        assert sum(counts) == 12
        models = s.gateway.router.latency.models()
        # Fresh inputs (scrapes every 50 ms) calibrate; the ledger is empty once every answer ended.
        assert sum(m.ttft.observations for m in models.values()) > 0
        assert sum(m.tpot.observations for m in models.values()) > 0
        assert all(m.pending_tokens == 0 and m.pending_requests == 0 for m in models.values())
        # Every ended request left the KV-block ledger too (its blocks are free).
        assert [s.gateway.router.latency.kv_in_flight(r) for r in ("r0", "r1")] == [0, 0]


async def test_the_kv_ledger_holds_a_stream_until_it_ends() -> None:
    async with stack(replicas=1, time_scale=4.0) as s:
        est = s.gateway.router.latency
        body = chat(PROMPT, max_tokens=8, stream=True)
        async with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            chunks = r.aiter_bytes()
            await chunks.__anext__()
            assert est.kv_in_flight("r0") == 1  # dispatched, not ended
            async for _ in chunks:
                pass
        assert est.kv_in_flight("r0") == 0
        answer = await s.client.post("/v1/chat/completions", json=chat(PROMPT, max_tokens=4))
        assert answer.status_code == 200
        assert est.kv_in_flight("r0") == 0  # a non-streaming answer leaves it at its end as well


async def test_a_non_streaming_answer_leaves_the_ledger_without_calibrating() -> None:
    async with stack(replicas=1) as s:
        r = await s.client.post("/v1/chat/completions", json=chat(PROMPT, max_tokens=4))
        assert r.status_code == 200
        assert "ttft_ms=" in r.headers["x-kvgate-route"]
        m = s.gateway.router.latency.models()["r0"]
        assert (m.pending_requests, m.pending_tokens, m.ttft.observations) == (0, 0, 0)
        assert await metric_value(s.client, "kvgate_ttft_prediction_error_ratio_count") == 0


async def test_the_latency_gate_does_not_serialise_non_streaming_answers() -> None:
    """A non-streaming answer reports no first token: its prefill leaves the ledger when it is
    predicted done, so the gate lets the next request in while it decodes (before, the gate held one
    replica to one such request at a time: its prefill counted as ahead of the next until it ended)."""
    config = {
        "models": [{"name": MODEL, "latency_prior": {"profile": "tiny", "time_scale": 4.0}}],
        "flow_control": {
            "predicted_admission": True,
            "saturation": {"max_in_flight_per_replica": 16, "max_waiting_per_replica": 8},
        },
    }
    async with stack(replicas=1, time_scale=4.0, config=config) as s:
        engine = s.fleet.replica(0).engine
        step = engine.step
        decoding: list[int] = []  # requests that decoded a token, per engine step

        def counted_step(now: float) -> StepResult:
            result = step(now)
            decoding.append(result.num_decode_seqs)
            return result

        engine.step = counted_step  # type: ignore[method-assign]
        n = 6
        bodies = [chat(f"Request {i}: {PROMPT}", max_tokens=48) for i in range(n)]  # nothing shared
        answers = await asyncio.gather(*(s.client.post("/v1/chat/completions", json=b) for b in bodies))
        assert [r.status_code for r in answers] == [200] * n
        # Decodes overlapped at the replica: most of the six were in its batch at once.
        assert max(decoding) >= n // 2
        queued = await metric_value(s.client, "kvgate_admissions_total", {"path": "queued"})
        assert queued > 0  # the gate did hold some: it is on, and the prefills were spaced out
        m = s.gateway.router.latency.models()["r0"]
        assert (m.pending_requests, m.pending_tokens, m.ttft.observations) == (0, 0, 0)


async def test_the_latency_knee_filter_routes_away_from_a_replica_with_a_long_prefill_ahead() -> None:
    """With the gate on, a replica whose predicted TTFT for the request is past the knee (here: a
    20,000-token prefill kvgate sent it has not had its first token) gets nothing while the other is
    within it; with the gate off the default profile spreads the same prompts over both."""

    async def replicas_chosen(predicted_admission: bool) -> set[str]:
        config = {
            "models": [{"name": MODEL, "latency_prior": {"profile": "tiny", "time_scale": 4.0}}],
            "flow_control": {"predicted_admission": predicted_admission},
        }
        async with stack(replicas=2, time_scale=4.0, config=config) as s:
            gw = s.gateway
            est = gw.router.latency
            r0 = gw.fleet.snapshot().by_name("r0")
            assert r0 is not None
            est.dispatched(est.predict(r0, 20_000, gw.clock(), 1.0))  # never prefilled: stays ahead
            chosen = set()
            for i in range(8):
                r = await s.client.post(
                    "/v1/chat/completions", json=chat(f"Request {i}: {PROMPT}", max_tokens=2)
                )
                assert r.status_code == 200
                fields = dict(part.split("=", 1) for part in r.headers["x-kvgate-route"].split(";"))
                chosen.add(fields["replica"])
            return chosen

    assert await replicas_chosen(True) == {"r1"}
    assert await replicas_chosen(False) == {"r0", "r1"}
