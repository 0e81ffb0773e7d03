"""The server side of kvgate's sockets: TCP_NODELAY on every accepted connection."""

from __future__ import annotations

import socket

from tests.gateway.stack import chat, stack


async def test_accepted_connections_have_tcp_nodelay() -> None:
    # Without it uvicorn's separate header and body writes wait ~40 ms for the client's delayed ACK.
    async with stack(replicas=1) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("hi", max_tokens=2))
        assert r.status_code == 200
        server = s.server._server
        assert server is not None
        conns = list(server.server_state.connections)
        assert conns, "the keep-alive connection should still be open"
        for proto in conns:
            sock = proto.transport.get_extra_info("socket")  # type: ignore[attr-defined]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
