"""kvgate in front of an https:// replica behind a path prefix: a TLS proxy on loopback (certificate
made for the test, trusted through `upstream.tls_ca_file`) that strips `/gpu-0` and passes the rest
to a simulated replica. Proxying and scraping both go through it."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import pytest

from gateway.config import parse_config
from gateway.server import GatewayServer
from simulator.fleet import SimFleet
from tests.gateway.stack import MODEL, Stack, chat, wait_until_scraped
from tests.gateway.upstream.scripted import self_signed, server


def tls_proxy(port: int, seen: list[bytes]):  # type: ignore[no-untyped-def]
    """A handler that strips the /gpu-0 prefix from each request line and pipes to 127.0.0.1:port."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", port)

        async def upstream() -> None:
            while line := await r.readline():
                if line.startswith((b"GET ", b"POST ")):
                    method, target, version = line.split(b" ", 2)
                    assert target.startswith(b"/gpu-0/"), target
                    seen.append(target.split(b"?")[0])
                    line = b" ".join((method, target.removeprefix(b"/gpu-0"), version))
                    head = line + await r.readuntil(b"\r\n\r\n")
                    length = next(
                        (int(h.split(b":")[1]) for h in head.split(b"\r\n")
                         if h.lower().startswith(b"content-length:")),
                        0,
                    )
                    uw.write(head + await r.readexactly(length))
                    await uw.drain()
            uw.close()

        async def downstream() -> None:
            while data := await ur.read(65536):
                w.write(data)
                await w.drain()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        uw.close()

    return handler


@pytest.mark.timeout(60)
async def test_an_https_replica_under_a_path_is_proxied_and_scraped(tmp_path: Path) -> None:
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("the openssl command is not installed: no certificate for a TLS test server")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(*made)
    seen: list[bytes] = []
    async with SimFleet(replicas=1, profile="tiny") as fleet:
        port = int(fleet.urls[0].rsplit(":", 1)[1])
        async with server(tls_proxy(port, seen), tls=tls, path="/gpu-0/") as (url, _):
            cfg = parse_config({
                "replicas": [{"url": url, "model": MODEL, "name": "r0"}],
                "fleet": {"scrape_interval_s": 0.05, "health_interval_s": 0.1},
                "upstream": {"connect_timeout_s": 3, "tls_ca_file": str(made[0])},
            })
            gw = GatewayServer(cfg)
            async with gw, httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
                await wait_until_scraped(Stack(fleet, gw, client))
                r = await client.post("/v1/chat/completions", json=chat("hello over tls", max_tokens=3))
                assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r0"
                streamed = chat("and streamed", max_tokens=3, stream=True)
                r = await client.post("/v1/chat/completions", json=streamed)
                assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert {b"/gpu-0/metrics", b"/gpu-0/v1/models", b"/gpu-0/v1/chat/completions"} <= set(seen)
