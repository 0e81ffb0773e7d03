"""A stack whose config is a file on disk, for reload tests: simulated replicas, kvgate started from
the file (`ConfigFile`), the file rewritten by the test, reloads through the admin API."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.config_file import ConfigFile
from gateway.server import GatewayServer
from simulator.fleet import SimFleet
from tests.gateway.stack import MODEL, Stack, merge, wait_until_scraped
from tests.gateway.tenancy_stack import ADMIN_KEY, base_config

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class ReloadStack:
    """`path` is what kvgate reads; with `symlinked`, a link to `<dir>/..data/kvgate.yaml` as a
    Kubernetes ConfigMap volume lays it out, and `write(..., swap=True)` swaps the link."""

    stack: Stack
    path: Path
    base: dict[str, Any]
    symlinked: bool = False
    _swaps: int = field(default=0)

    @property
    def client(self) -> httpx.AsyncClient:
        return self.stack.client

    @property
    def gateway(self) -> Any:
        return self.stack.gateway

    def write(self, config: Mapping[str, Any], *, swap: bool = False) -> None:
        self.write_text(yaml.safe_dump(merge(self.base, config), sort_keys=False), swap=swap)

    def write_text(self, text: str, *, swap: bool = False) -> None:
        if not swap:
            self.path.write_text(text)  # in place (through the link, if any)
            return
        assert self.symlinked
        self._swaps += 1
        data = self.path.parent / f"..data-{self._swaps}"
        data.mkdir()
        (data / "kvgate.yaml").write_text(text)
        link = self.path.parent / ".kvgate.yaml.new"
        link.symlink_to(data / "kvgate.yaml")
        os.replace(link, self.path)  # atomic, as the kubelet swaps ..data

    async def reload(self) -> httpx.Response:
        return await self.client.post("/admin/reload", headers=ADMIN)

    async def config_status(self) -> dict[str, Any]:
        r = await self.client.get("/admin/config", headers=ADMIN)
        assert r.status_code == 200, r.text
        return dict(r.json())


@contextlib.asynccontextmanager
async def reload_stack(
    tmp_path: Path, config: Mapping[str, Any], replicas: int = 2, symlinked: bool = False, **fleet_kw: Any
) -> AsyncIterator[ReloadStack]:
    fleet_kw.setdefault("profile", "tiny")
    async with SimFleet(replicas=replicas, **fleet_kw) as fleet:
        base = merge(base_config([(fleet, MODEL, "r")]), {"server": {"debug_headers": True}})
        path = tmp_path / "kvgate.yaml"
        if symlinked:
            data = tmp_path / "..data-0"
            data.mkdir()
            (data / "kvgate.yaml").touch()
            path.symlink_to(data / "kvgate.yaml")
        path.write_text(yaml.safe_dump(merge(base, config), sort_keys=False))
        source = ConfigFile(path)
        server = GatewayServer(source.load(), config_file=source)
        async with server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            s = Stack(fleet, server, client)
            await wait_until_scraped(s)
            yield ReloadStack(s, path, base, symlinked)
