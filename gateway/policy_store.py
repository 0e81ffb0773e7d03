"""Where the admin API's changes are kept: this process (`memory://`) or Redis (shared, persistent).

Redis layout (`{p}` = `state.key_prefix`; the `{admin}` hash tag keeps them on one Redis Cluster
shard, so the MULTIs below work there too):

    {p}{admin}:keys         hash   key hash -> KeyRecord JSON (created through the API, or revoked)
    {p}{admin}:key_names    hash   "<tenant>/<name>" -> key hash of the live API key with that name
    {p}{admin}:tenants      hash   tenant name -> TenantPatch JSON
    {p}{admin}:generation   int    +1 on every change
    {p}{admin}:gateways     hash   gateway id -> "<generation applied> <Unix time>" (heartbeats)
    {p}{admin}:changed      pub/sub channel: the new generation, published after every change

A change is one MULTI (the record and INCR of the generation) and a PUBLISH; a reload is one MULTI
reading the generation and both hashes, so what a gateway applies is always one consistent state.
Creating a key claims its name with HSETNX first, so two admins racing for one name cannot both win.
With `memory://` the same operations work on dicts, for one gateway, and last as long as it does.
Records that no longer validate (a config class tightened since) are logged and skipped.

Calls are bounded by `timeout_s` (the admin path's, not the request path's) and raise on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.policy_overrides import KeyRecord, Overrides, TenantPatch, loads_key, loads_patch

log = logging.getLogger(__name__)


class NameTaken(Exception):
    """A live API key of the tenant already has this name."""


class PolicyStore(Protocol):
    async def load(self) -> Overrides: ...

    async def generation(self) -> int: ...

    async def create_key(self, record: KeyRecord) -> int:
        """Store a new live API key; raises NameTaken. Returns the new generation."""

    async def revoke_key(self, record: KeyRecord) -> int:
        """Store a revocation (`record.revoked_at` set) and free an API key's name."""

    async def put_patch(self, tenant: str, patch: TenantPatch | None) -> int:
        """Set (or, with None, drop) the tenant's patch."""

    async def heartbeat(self, gateway_id: str, generation: int, now: float) -> None:
        """Say which generation this gateway has applied, and that it is alive."""

    async def gateways(self) -> dict[str, tuple[int, float]]:
        """Each gateway's last heartbeat: (generation applied, Unix time)."""

    async def forget(self, gateway_ids: list[str]) -> None: ...

    async def close(self) -> None: ...


class MemoryPolicyStore:
    def __init__(self) -> None:
        self._keys: dict[str, KeyRecord] = {}
        self._names: dict[str, str] = {}
        self._tenants: dict[str, TenantPatch] = {}
        self._gen = 0
        self._gateways: dict[str, tuple[int, float]] = {}

    async def load(self) -> Overrides:
        return Overrides(generation=self._gen, keys=dict(self._keys), tenants=dict(self._tenants))

    async def generation(self) -> int:
        return self._gen

    async def create_key(self, record: KeyRecord) -> int:
        name = f"{record.tenant}/{record.name}"
        if name in self._names:
            raise NameTaken(name)
        self._names[name] = record.hash
        self._keys[record.hash] = record
        self._gen += 1
        return self._gen

    async def revoke_key(self, record: KeyRecord) -> int:
        name = f"{record.tenant}/{record.name}"
        if self._names.get(name) == record.hash:
            del self._names[name]
        self._keys[record.hash] = record
        self._gen += 1
        return self._gen

    async def put_patch(self, tenant: str, patch: TenantPatch | None) -> int:
        if patch is None:
            self._tenants.pop(tenant, None)
        else:
            self._tenants[tenant] = patch
        self._gen += 1
        return self._gen

    async def heartbeat(self, gateway_id: str, generation: int, now: float) -> None:
        self._gateways[gateway_id] = (generation, now)

    async def gateways(self) -> dict[str, tuple[int, float]]:
        return dict(self._gateways)

    async def forget(self, gateway_ids: list[str]) -> None:
        for g in gateway_ids:
            self._gateways.pop(g, None)

    async def close(self) -> None:
        return None


class RedisPolicyStore:
    def __init__(self, client: aioredis.Redis, *, key_prefix: str, timeout_s: float) -> None:
        self._r = client
        self._timeout_s = timeout_s
        p = key_prefix + "{admin}:"
        self.keys_key, self.names_key, self.tenants_key = p + "keys", p + "key_names", p + "tenants"
        self.gen_key, self.gateways_key, self.channel = p + "generation", p + "gateways", p + "changed"

    @classmethod
    def from_url(cls, url: str, *, key_prefix: str, timeout_s: float = 2.0) -> RedisPolicyStore:
        client = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )
        return cls(client, key_prefix=key_prefix, timeout_s=timeout_s)

    @property
    def client(self) -> aioredis.Redis:
        return self._r

    async def load(self) -> Overrides:
        async with asyncio.timeout(self._timeout_s):
            async with self._r.pipeline(transaction=True) as tx:
                tx.get(self.gen_key)
                tx.hgetall(self.keys_key)
                tx.hgetall(self.tenants_key)
                gen, keys, tenants = await tx.execute()
        return Overrides(
            generation=int(gen or 0),
            keys=_valid(keys, loads_key, "key"),
            tenants=_valid(tenants, loads_patch, "tenant patch"),
        )

    async def generation(self) -> int:
        async with asyncio.timeout(self._timeout_s):
            return int(await self._r.get(self.gen_key) or 0)

    async def create_key(self, record: KeyRecord) -> int:
        name = f"{record.tenant}/{record.name}"
        async with asyncio.timeout(self._timeout_s):
            if not await self._r.hsetnx(self.names_key, name, record.hash):
                raise NameTaken(name)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._change(lambda tx: tx.hset(self.keys_key, record.hash, record.dumps()))
        except BaseException:
            # The key was not stored (or we cannot tell): give the name back, so a retry can claim it.
            # If the record did land, the retry's new key simply replaces this one's name.
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(self._timeout_s):
                    if (await self._r.hget(self.names_key, name)) == record.hash.encode():
                        await self._r.hdel(self.names_key, name)
            raise

    async def revoke_key(self, record: KeyRecord) -> int:
        name = f"{record.tenant}/{record.name}"
        async with asyncio.timeout(self._timeout_s):
            gen = await self._change(lambda tx: tx.hset(self.keys_key, record.hash, record.dumps()))
            if (await self._r.hget(self.names_key, name)) == record.hash.encode():
                await self._r.hdel(self.names_key, name)
            return gen

    async def put_patch(self, tenant: str, patch: TenantPatch | None) -> int:
        async with asyncio.timeout(self._timeout_s):
            if patch is None:
                return await self._change(lambda tx: tx.hdel(self.tenants_key, tenant))
            return await self._change(lambda tx: tx.hset(self.tenants_key, tenant, patch.dumps()))

    async def _change(self, write: Any) -> int:
        async with self._r.pipeline(transaction=True) as tx:
            write(tx)
            tx.incr(self.gen_key)
            replies = await tx.execute()
        gen = int(replies[-1])
        await self._r.publish(self.channel, str(gen))
        return gen

    async def heartbeat(self, gateway_id: str, generation: int, now: float) -> None:
        async with asyncio.timeout(self._timeout_s):
            await self._r.hset(self.gateways_key, gateway_id, f"{generation} {now:.3f}")

    async def gateways(self) -> dict[str, tuple[int, float]]:
        async with asyncio.timeout(self._timeout_s):
            raw = await self._r.hgetall(self.gateways_key)
        out = {}
        for k, v in raw.items():
            gen, _, at = _text(v).partition(" ")
            out[_text(k)] = (int(gen), float(at))
        return out

    async def forget(self, gateway_ids: list[str]) -> None:
        if gateway_ids:
            async with asyncio.timeout(self._timeout_s):
                await self._r.hdel(self.gateways_key, *gateway_ids)

    async def close(self) -> None:
        await self._r.aclose()


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _valid(raw: dict[bytes, bytes], parse: Any, what: str) -> dict[str, Any]:
    out = {}
    for k, v in raw.items():
        try:
            out[k.decode()] = parse(v)
        except (ValidationError, ValueError) as err:
            log.error("admin API %s %r in the store no longer validates; ignored: %s", what, k.decode(), err)
    return out
