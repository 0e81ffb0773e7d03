"""The replicas file and DNS as discovery sources, end to end: kvgate in front of simulated replicas,
the file on disk (in-place edits, a ConfigMap-style symlink swap, half-written and invalid content),
and a real DNS server on loopback (dnslib) answering A and AAAA queries.

"Within one interval" is counted in the source's own polls, not in wall-clock time: a replica added
to the file (or to DNS) must be in the fleet after the first poll that follows the change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSServer

from loadtests.ports import free_port
from simulator.fleet import SimFleet
from tests.gateway.discovery.helpers import Kvgate, chat, kvgate, pods, until
from tests.gateway.stack import MODEL

# -- the replicas file ------------------------------------------------------------------------------


def entries(fleet: SimFleet, *indexes: int) -> list[dict[str, Any]]:
    return [{"url": fleet.urls[i], "model": MODEL, "name": f"r{i}"} for i in indexes]


def write(path: Path, data: Any) -> None:
    """An in-place rewrite (truncate, then write), as an editor or `cat >` does."""
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))


async def next_polls(kv: Kvgate, n: int = 1) -> None:
    source = kv.gateway.discovery.sources["file"]
    target = source.polls + n
    await until(lambda: source.polls >= target, what=f"{n} more polls")


async def test_a_replica_added_to_the_file_is_in_the_fleet_after_one_poll_and_then_routable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "replicas.yaml"
    async with SimFleet(replicas=2, profile="tiny") as fleet:
        write(path, entries(fleet, 0))
        config = {"discovery": {"file": {"path": str(path), "interval_s": 0.2}, "stale_after_s": 5}}
        async with kvgate(config) as kv:
            await until(lambda: kv.states() == {"r0": "ready"})
            source = kv.gateway.discovery.sources["file"]
            before = source.polls
            write(path, entries(fleet, 0, 1))
            await until(lambda: "r1" in kv.states())
            assert source.polls <= before + 1  # noticed by the first poll after the write
            await until(lambda: kv.states().get("r1") == "ready")
            kv.gateway.fleet.drain("r0")
            r = await kv.client.post("/v1/chat/completions", json=chat("to the new one"))
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r1"

            write(path, entries(fleet, 1))
            await until(lambda: set(kv.states()) == {"r1"})


async def test_the_file_keeps_its_last_good_list_through_half_written_and_invalid_content(
    tmp_path: Path,
) -> None:
    path = tmp_path / "replicas.yaml"
    async with SimFleet(replicas=2, profile="tiny") as fleet:
        write(path, entries(fleet, 0, 1))
        config = {"discovery": {"file": {"path": str(path), "interval_s": 0.1}, "stale_after_s": 5}}
        async with kvgate(config) as kv:
            await until(lambda: kv.states() == {"r0": "ready", "r1": "ready"})
            status = kv.gateway.discovery.reconciler.statuses()[0]
            for bad in ("", "- {url: http://127.0.0.1:1, model: [", "- {url: ftp://x, model: m}", "a: 1"):
                errors = status.errors
                write(path, bad)
                await next_polls(kv, 2)
                assert status.errors > errors, bad
                assert kv.states() == {"r0": "ready", "r1": "ready"}, bad
            path.unlink()
            await next_polls(kv, 2)
            assert set(kv.states()) == {"r0", "r1"} and "cannot read" in (status.last_error or "")
            write(path, "[]")  # an explicit empty list is a list
            await until(lambda: kv.states() == {})


async def test_a_configmap_style_symlink_swap_is_noticed(tmp_path: Path) -> None:
    """A mounted ConfigMap: replicas.yaml -> ..data/replicas.yaml, ..data -> ..<timestamp>/; an
    update writes a new timestamped folder and renames a new ..data link over the old one."""
    mount = tmp_path / "kvgate"
    mount.mkdir()

    def publish(version: str, data: Any) -> None:
        folder = mount / f"..{version}"
        folder.mkdir()
        (folder / "replicas.yaml").write_text(yaml.safe_dump(data))
        tmp_link = mount / "..data_tmp"
        tmp_link.symlink_to(folder.name)
        os.replace(tmp_link, mount / "..data")  # the atomic swap

    async with SimFleet(replicas=2, profile="tiny") as fleet:
        publish("2026_12_05_1", entries(fleet, 0))
        (mount / "replicas.yaml").symlink_to("..data/replicas.yaml")
        path = mount / "replicas.yaml"
        config = {"discovery": {"file": {"path": str(path), "interval_s": 0.2}, "stale_after_s": 5}}
        async with kvgate(config) as kv:
            await until(lambda: kv.states() == {"r0": "ready"})
            source = kv.gateway.discovery.sources["file"]
            before = source.polls
            publish("2026_12_05_2", entries(fleet, 1))
            await until(lambda: set(kv.states()) == {"r1"})
            assert source.polls <= before + 1


# -- DNS --------------------------------------------------------------------------------------------

NAME = "vllm-headless.inference.svc.cluster.local"


class Zone(BaseResolver):  # type: ignore[misc]
    """Answers A and AAAA for NAME from `records`; NXDOMAIN for anything else (or when `exists` is
    False); answers nothing at all while `silent` (a server that is down)."""

    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {"A": [], "AAAA": []}
        self.exists = True
        self.queries = 0

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        self.queries += 1
        reply = request.reply()
        qname = request.q.qname
        if not self.exists or str(qname).rstrip(".") != NAME:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        qtype = QTYPE[request.q.qtype]
        for ip in self.records.get(qtype, []):
            rdata = A(ip) if qtype == "A" else AAAA(ip)
            reply.add_answer(RR(qname, getattr(QTYPE, qtype), rdata=rdata, ttl=5))
        return reply


@pytest.fixture
def dns_server() -> Iterator[tuple[Zone, int, DNSServer]]:
    zone = Zone()
    port = free_port(udp=True)  # below the ephemeral range: no outgoing socket takes it meanwhile
    server = DNSServer(zone, address="127.0.0.1", port=port)
    server.start_thread()
    try:
        yield zone, port, server
    finally:
        if server.isAlive():
            server.stop()
        server.server.server_close()


async def test_dns_records_added_and_removed_become_replicas_joining_and_leaving(
    dns_server: tuple[Zone, int, DNSServer],
) -> None:
    zone, dns_port, _ = dns_server
    async with pods(["127.0.0.2", "127.0.0.3"]) as p:
        zone.records["A"] = ["127.0.0.2"]
        config = {
            "discovery": {
                "dns": {
                    "name": NAME,
                    "port": p.port,
                    "model": MODEL,
                    "interval_s": 0.2,
                    "timeout_s": 0.5,
                    "nameservers": [f"127.0.0.1:{dns_port}"],
                },
                "stale_after_s": 2,
            }
        }
        a, b = f"127.0.0.2:{p.port}", f"127.0.0.3:{p.port}"
        async with kvgate(config) as kv:
            await until(lambda: kv.states() == {a: "ready"})
            source = kv.gateway.discovery.sources["dns"]
            before = source.polls
            zone.records["A"] = ["127.0.0.2", "127.0.0.3"]
            zone.records["AAAA"] = ["::1"]
            await until(lambda: b in kv.states())
            # Noticed by the first poll that starts after the change: a DNS poll is a network round
            # trip, and one may be in flight with the old answer when the records change.
            assert source.polls <= before + 2
            assert f"[::1]:{p.port}" in kv.states()  # AAAA too; nothing serves there: never ready
            await until(lambda: kv.states().get(b) == "ready")
            assert kv.states()[f"[::1]:{p.port}"] == "not_ready"
            kv.gateway.fleet.drain(a)
            r = await kv.client.post("/v1/chat/completions", json=chat("dns"))
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == b
            kv.gateway.fleet.undrain(a)

            zone.records = {"A": ["127.0.0.3"], "AAAA": []}
            await until(lambda: set(kv.states()) == {b})

            # NXDOMAIN is a good, empty answer: the name has no replicas now.
            zone.exists = False
            await until(lambda: kv.states() == {})
            assert (await kv.client.get("/ready")).status_code == 503
            zone.exists = True
            await until(lambda: kv.states() == {b: "ready"})


async def test_a_dns_server_that_stops_answering_keeps_the_last_list_and_goes_stale(
    dns_server: tuple[Zone, int, DNSServer],
) -> None:
    zone, dns_port, server = dns_server
    async with pods(["127.0.0.2"]) as p:
        zone.records["A"] = ["127.0.0.2"]
        config = {
            "discovery": {
                "dns": {"name": NAME, "port": p.port, "interval_s": 0.2, "timeout_s": 0.3,
                        "nameservers": [f"127.0.0.1:{dns_port}"]},
                "stale_after_s": 1.5,
            }
        }  # fmt: skip
        name = f"127.0.0.2:{p.port}"
        async with kvgate(config) as kv:
            await until(lambda: kv.states() == {name: "ready"})
            # No model configured: the pool is what the replica's /v1/models lists.
            assert kv.gateway.fleet.snapshot().by_name(name).pool == MODEL
            server.stop()  # queries now go unanswered
            await until(lambda: kv.gateway.discovery.stale_sources() == ["dns"], timeout=5)
            assert kv.states() == {name: "ready"}
            assert (await kv.client.get("/ready")).status_code == 503
