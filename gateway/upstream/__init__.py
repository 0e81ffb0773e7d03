"""kvgate's HTTP/1.1 client for the replicas: keep-alive connections parsed by httptools."""

from gateway.upstream.connection import BrokenError, ConnectError, UpstreamError
from gateway.upstream.pool import UpstreamPool, UpstreamResponse

__all__ = ["BrokenError", "ConnectError", "UpstreamError", "UpstreamPool", "UpstreamResponse"]
