"""DNS discovery: a name's A and AAAA records, resolved every `interval_s`; each address is a replica.

For a headless Service (`vllm-headless.inference.svc.cluster.local`) or any DNS round-robin. An
address that appears becomes a replica named `ip:port` (`[ip]:port` for IPv6); one that disappears
departs. A name that does not exist (NXDOMAIN) or has no records of a type is a good, empty answer;
a resolution that times out or that every server refuses keeps the last good list.

The resolver is dnspython's asyncio one, chosen over `loop.getaddrinfo` (which runs the blocking
libc resolver in a thread, caches as the system does, and cannot be pointed at a given server) and
over aiodns (c-ares bindings: a compiled dependency for what is one query per type per interval).
dnspython is pure Python, typed and well kept; it asks the configured servers directly, without a
cache, so every interval sees the records as they are now.
"""

from __future__ import annotations

import asyncio
import ipaddress

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from gateway.config_discovery import DnsDiscoveryConfig
from gateway.discovery.reconciler import Reconciler
from gateway.fleet.membership import ReplicaSpec

SOURCE = "dns"


class DnsLookupError(RuntimeError):
    """A resolution that gave no usable answer (timeout, every server failed)."""


def parse_nameserver(text: str) -> tuple[str, int]:
    """`host`, `host:port`, `v6`, `[v6]` or `[v6]:port` -> (address, port); the port defaults to 53.
    Raises ValueError for anything else (the address must be an IP: there is no resolver to ask)."""
    host, port = text, 53
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad nameserver {text!r}")
        if rest:
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p)
    ipaddress.ip_address(host)
    if not 0 < port < 65536:
        raise ValueError(f"bad nameserver port in {text!r}")
    return host, port


def build_resolver(nameservers: tuple[str, ...]) -> dns.asyncresolver.Resolver:
    """A resolver asking `nameservers` (empty: the system's, from /etc/resolv.conf), with no cache."""
    if not nameservers:
        return dns.asyncresolver.Resolver()
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [dns.nameserver.Do53Nameserver(*parse_nameserver(ns)) for ns in nameservers]
    return resolver


def replica_name(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class DnsSource:
    """Resolves one name every interval and reports its addresses as replicas (see the module doc)."""

    name = SOURCE

    def __init__(
        self,
        cfg: DnsDiscoveryConfig,
        reconciler: Reconciler,
        *,
        slow_start_s: float = 0.0,
        resolver: dns.asyncresolver.Resolver | None = None,
    ) -> None:
        self._cfg = cfg
        self._reconciler = reconciler
        self._slow_start_s = slow_start_s
        self._resolver = resolver or build_resolver(cfg.nameservers)
        self._last: frozenset[str] | None = None
        self.polls = 0  # polls finished (tests count intervals with it)
        self.synced = asyncio.Event()

    async def run(self) -> None:
        while True:
            await self.poll()
            self.polls += 1
            self.synced.set()
            await asyncio.sleep(self._cfg.interval_s)

    async def poll(self) -> frozenset[str] | None:
        """One resolution; the addresses when it succeeded, else None (failure reported)."""
        try:
            async with asyncio.timeout(self._cfg.timeout_s):
                v4, v6 = await asyncio.gather(self._addresses("A"), self._addresses("AAAA"))
        except (TimeoutError, DnsLookupError) as err:
            self._reconciler.failed(self.name, f"{self._cfg.name}: {err or 'timed out'}")
            return None
        addresses = frozenset(v4 + v6)
        if addresses == self._last:
            self._reconciler.touch(self.name)
            return addresses
        self._last = addresses
        self._reconciler.update(self.name, self._specs(sorted(addresses)))
        return addresses

    async def _addresses(self, rdtype: str) -> list[str]:
        try:
            answer = await self._resolver.resolve(
                self._cfg.name, rdtype, lifetime=self._cfg.timeout_s, search=False
            )
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.DNSException as err:  # NoNameservers, LifetimeTimeout, ...
            raise DnsLookupError(f"{rdtype}: {err}") from None
        return [r.to_text() for r in answer]

    def _specs(self, addresses: list[str]) -> dict[str, ReplicaSpec]:
        cfg = self._cfg
        specs = {}
        for address in addresses:
            name = replica_name(address, cfg.port)
            specs[name] = ReplicaSpec(
                name=name,
                url=f"{cfg.scheme}://{name}",
                model=cfg.model,
                labels=cfg.labels,
                await_model=True,
                slow_start_s=self._slow_start_s,
                source=SOURCE,
            )
        return specs
