"""A replica's base URL, split into what the upstream client needs to reach it.

`http://10.0.0.5:8000` is plain TCP to 10.0.0.5:8000; `https://vllm.internal` is TLS to port 443,
checked against the name `vllm.internal`; a path (`http://host:8000/vllm/`) is a prefix that every
request path gets (`/vllm/v1/chat/completions`, `/vllm/metrics`), for a replica behind a proxy that
routes by path. The config validates replica URLs with this same function, so what loads is what the
client can use.

Refused, with the reason: credentials in the URL (`user:pass@`: a URL ends up in logs and metrics
labels; replica credentials are to come through a setting of their own), a query or a fragment
(requests carry their own), spaces or control characters, a missing host, a bad port, non-ASCII.
The reasons never repeat the URL: it may hold a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    tls: bool
    host: str  # to connect to, and TLS's server name; an IPv6 literal without brackets
    port: int  # 1-65535; 80 or 443 when the URL names none
    host_header: bytes  # the URL's authority as written (ASCII), for the Host header
    path_prefix: bytes  # b"" or b"/a/b" (no trailing slash), put before every request path


def parse_replica_url(url: str) -> ReplicaAddress:
    """Split `url`; raises ValueError with a reason that does not quote the URL."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ValueError("is not a valid URL") from None
    if parts.scheme not in DEFAULT_PORTS or not url.lower().startswith(parts.scheme + "://"):
        raise ValueError("must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise ValueError(
            "must not contain credentials (user:password@): a URL ends up in logs and metrics labels, "
            "so kvgate never takes credentials from one"
        )
    if "?" in url:
        raise ValueError("must not have a query (?...): kvgate writes each request's own")
    if "#" in url:
        raise ValueError("must not have a fragment (#...)")
    if not parts.hostname:
        raise ValueError("has no host")
    if not parts.netloc.isascii():
        raise ValueError("the host must be ASCII (write an international name in its xn-- form)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has a bad port (1-65535)") from None
    if port == 0:
        raise ValueError("has a bad port (1-65535)")
    if not parts.path.isascii():
        raise ValueError("the path must be ASCII (percent-encode the rest)")
    return ReplicaAddress(
        tls=parts.scheme == "https",
        host=parts.hostname,
        port=port or DEFAULT_PORTS[parts.scheme],
        host_header=parts.netloc.encode("ascii"),
        path_prefix=parts.path.rstrip("/").encode("ascii"),
    )
