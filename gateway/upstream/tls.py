"""The TLS client settings for https:// replicas: one `ssl.SSLContext`, built once at start-up."""

from __future__ import annotations

import ssl


def client_tls_context(ca_file: str | None = None, verify: bool = True) -> ssl.SSLContext:
    """A client context for https:// replicas.

    Certificates are checked against the system's trusted CAs, or, when `ca_file` (a PEM bundle)
    is given, against that bundle only: a private CA's replicas need nothing else, and nothing else
    should vouch for them. Host names are checked too. `verify=False` checks neither (the connection
    is encrypted but anyone in the path can pose as the replica); the config warns about it.
    Raises ValueError, saying why, when `ca_file` cannot be read or holds no certificate.
    Reads the file (blocking): call it at start-up, not on the event loop's request path.
    """
    try:
        ctx = ssl.create_default_context(cafile=ca_file)  # with a cafile: that file's CAs only
    except ssl.SSLError as err:
        reason = str(err.reason or err).lower().replace("_", " ")
        raise ValueError(f"cannot load {ca_file!r}: {reason} (a PEM file is expected)") from None
    except OSError as err:
        raise ValueError(f"cannot load {ca_file!r}: {err.strerror or err}") from None
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])  # the one protocol kvgate's client speaks
    return ctx
