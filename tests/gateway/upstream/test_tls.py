"""https:// replicas against a loopback TLS server with a certificate made for the test (openssl):
trusted through `tls_ca_file`, refused cleanly without it, accepted unchecked with verify off."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from gateway.upstream import ConnectError, UpstreamPool
from gateway.upstream.tls import client_tls_context
from tests.gateway.upstream.scripted import read_request, reply, self_signed, server


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("the openssl command is not installed: no certificate for a TLS test server")
    return made


def server_tls(cert: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    return ctx


async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    while True:
        body = await read_request(r)
        w.write(reply(body))
        await w.drain()


async def test_a_replica_behind_a_private_ca_is_trusted_through_the_ca_file(cert: tuple[Path, Path]) -> None:
    async with server(echo, tls=server_tls(cert)) as (url, accepted):
        assert url.startswith("https://")
        pool = UpstreamPool(connect_timeout_s=2, tls=client_tls_context(ca_file=str(cert[0])))
        for i in range(2):
            resp = await pool.post(url, "/v1/completions", b'{"n": %d}' % i)
            assert resp.status == 200 and await resp.read() == b'{"n": %d}' % i
            resp.release()
        assert len(accepted) == 1  # kept alive over TLS too
        pool.close()


async def test_without_the_ca_the_certificate_is_refused_with_a_clear_connect_error(
    cert: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    async with server(echo, tls=server_tls(cert)) as (url, _):
        pool = UpstreamPool(connect_timeout_s=2)  # the default context: the system's CAs only
        with pytest.raises(ConnectError, match=r"TLS certificate not accepted: self.signed") as ei:
            await pool.post(url, "/x", b"{}")
        assert not ei.value.timed_out
        assert any("TLS certificate" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
        pool.close()


async def test_a_certificate_for_another_name_is_refused(cert: tuple[Path, Path]) -> None:
    async with server(echo, tls=server_tls(cert)) as (url, _):
        pool = UpstreamPool(connect_timeout_s=2, tls=client_tls_context(ca_file=str(cert[0])))
        with pytest.raises(ConnectError, match="certificate not accepted"):
            await pool.post(url.replace("127.0.0.1", "localhost"), "/x", b"{}")  # made for 127.0.0.1
        pool.close()


async def test_verify_off_accepts_any_certificate(cert: tuple[Path, Path]) -> None:
    async with server(echo, tls=server_tls(cert)) as (url, _):
        pool = UpstreamPool(connect_timeout_s=2, tls=client_tls_context(verify=False))
        resp = await pool.post(url.replace("127.0.0.1", "localhost"), "/x", b"{}")
        assert resp.status == 200 and await resp.read() == b"{}"
        resp.release()
        pool.close()


async def test_a_plain_http_server_behind_an_https_url_is_a_connect_error() -> None:
    async def plain(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(1)  # a TLS hello is no request: answered as a plain server would, then closed
        w.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await w.drain()

    async with server(plain) as (url, _):
        pool = UpstreamPool(connect_timeout_s=2)
        with pytest.raises(ConnectError, match="TLS"):
            await pool.post(url.replace("http://", "https://"), "/x", b"{}")
        pool.close()


async def test_a_close_delimited_body_over_tls_ends_normally(cert: tuple[Path, Path]) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: 1\n\n")
        await w.drain()

    async with server(handler, tls=server_tls(cert)) as (url, _):
        pool = UpstreamPool(connect_timeout_s=2, tls=client_tls_context(ca_file=str(cert[0])))
        resp = await pool.post(url, "/x", b"{}")
        async with asyncio.timeout(2):
            assert await resp.read() == b"data: 1\n\n"
        resp.release()
        pool.close()
