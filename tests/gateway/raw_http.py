"""Raw HTTP/1.1 over loopback sockets, for tests that must write exact bytes (half a header, a short
body) and see exactly what kvgate answers and when it closes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # names in lower case; a repeated name keeps the last value
    body: bytes

    def json(self) -> dict[str, object]:
        data = orjson.loads(self.body)
        assert isinstance(data, dict)
        return data


class RawConnection:
    """One client connection. Every read waits at most `timeout` seconds (a test must not hang)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout = timeout

    @classmethod
    async def open(cls, url: str, timeout: float = 5.0) -> RawConnection:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        return cls(reader, writer, timeout)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> RawResponse:
        """The next response (a Content-Length body, or a chunked one read to its end)."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), self.timeout)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            n = int(headers["content-length"])
            body = await asyncio.wait_for(self.reader.readexactly(n), self.timeout)
        elif headers.get("transfer-encoding") == "chunked":
            body = await self._chunked()
        else:
            body = b""
        return RawResponse(status, headers, body)

    async def _chunked(self) -> bytes:
        parts = []
        while True:
            size = int((await asyncio.wait_for(self.reader.readuntil(b"\r\n"), self.timeout)).strip(), 16)
            data = await asyncio.wait_for(self.reader.readexactly(size + 2), self.timeout)
            if size == 0:
                return b"".join(parts)
            parts.append(data[:-2])

    async def closed(self) -> bool:
        """True once the server has closed the connection (EOF or reset) within `timeout`; False if
        it is still open then. Any bytes still arriving first are read and dropped."""
        try:
            async with asyncio.timeout(self.timeout):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return True

    def close(self) -> None:
        self.writer.close()


def post_head(path: str, content_length: int, *extra: str) -> bytes:
    """The head of a JSON POST to `path` declaring `content_length` body bytes."""
    lines = [
        f"POST {path} HTTP/1.1",
        "host: kvgate",
        "content-type: application/json",
        f"content-length: {content_length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
