"""The `tcp://host:port` addresses of a replica's KV-event sockets, as the config gives them.

vLLM binds its PUB and ROUTER sockets (`--kv-events-config` `endpoint`/`replay_endpoint`, e.g.
`tcp://*:5557`); kvgate connects to them, so it needs a host it can reach: `tcp://10.0.0.5:5557`,
`tcp://vllm-0.vllm:5557`, `tcp://[fd00::5]:5557`. Anything else (another transport, a wildcard
host, a path, no port) is refused with the reason. Imports nothing from the gateway: the config
validates with it.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def parse_tcp_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of a `tcp://host:port` URL; ValueError with the reason. IPv6 hosts unbracketed."""
    if any(c.isspace() or ord(c) < 0x20 for c in url) or not url.isascii():
        raise ValueError("must be ASCII without spaces or control characters")
    if not url.startswith("tcp://"):
        raise ValueError("must be a tcp://host:port address (vLLM's socket, as kvgate reaches it)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("has a bad port (1-65535)") from None
    host = parts.hostname
    if not host or host == "*":
        raise ValueError("needs a host kvgate can connect to (not a wildcard)")
    if "@" in parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("must be tcp://host:port and nothing more")
    if port is None or not 0 < port < 65536:
        raise ValueError("needs a port (1-65535)")
    return host, port


def tcp_endpoint(host: str, port: int) -> str:
    """The ZeroMQ address of `host:port` (an IPv6 literal in brackets)."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
