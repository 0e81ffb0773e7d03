"""A full, current copy of one Kubernetes collection, kept by list + watch, never by watch alone.

The loop (`ListWatch.run`):

1. LIST the collection (`labelSelector`; no `resourceVersion`: a consistent read of the latest state)
   and hand the whole set over (`on_sync`);
2. WATCH from the list's `resourceVersion` with `allowWatchBookmarks=true`: each ADDED, MODIFIED or
   DELETED updates the copy and hands the whole set over again; a BOOKMARK only moves the
   resourceVersion on and proves the stream alive (`on_alive`);
3. go back to 1 when the watch ends for any reason: the server closed it (`timeoutSeconds`), the
   connection dropped, an ERROR event or HTTP 410 says the resourceVersion is too old (compacted),
   or `resync_s` has passed since the list (the periodic full re-list).

Re-listing on every reconnect (instead of resuming the watch from the last resourceVersion) costs one
list per `watch_timeout_s`, and closes the hole a resumed watch can leave: an event lost between two
watches (a proxy that replayed from the wrong point, a server that compacted in between) stays lost
until something re-lists; here the next list, at the latest `resync_s` later, corrects the set,
because the set handed over is always whole and the reconciler applies it as the truth.

Failures (`on_error`) are retried after `retry_s`, doubling up to 30 s; the copy handed over last
stays in force meanwhile (the reconciler keeps a failed source's last good set).

The HTTP client is given: an `httpx2.AsyncClient` with the API server as its base URL and its
credentials (built by `gateway.discovery.kubernetes_source` from lightkube's kubeconfig handling).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import orjson

log = logging.getLogger(__name__)

MAX_RETRY_S = 30.0
Objects = Mapping[str, Mapping[str, Any]]  # metadata.name -> the object as the API served it


class KubeApiError(RuntimeError):
    """The API server answered something kvgate cannot use; the message says what."""


@dataclass(frozen=True, slots=True)
class Collection:
    """A namespaced collection: `path` as `/apis/discovery.k8s.io/v1/namespaces/NS/endpointslices`."""

    path: str
    label_selector: str


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds; see `KubernetesDiscoveryConfig`."""

    resync_s: float
    watch_timeout_s: int
    request_timeout_s: float
    retry_s: float


class ListWatch:
    """Keeps one collection; calls `on_sync(objects)` with the whole current set after every list and
    every change, `on_alive()` on a bookmark, `on_error(message)` on a failure. The callbacks run on
    the loop and must not raise. `relists` counts why each watch ended (for tests and logs)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        collection: Collection,
        timing: Timing,
        *,
        on_sync: Callable[[Objects], None],
        on_alive: Callable[[], None],
        on_error: Callable[[str], None],
    ) -> None:
        self._client = client
        self._coll = collection
        self._t = timing
        self._on_sync = on_sync
        self._on_alive = on_alive
        self._on_error = on_error
        self.relists: Counter[str] = Counter()

    async def run(self) -> None:
        """Forever (until cancelled): list, watch, repeat (see the module doc)."""
        failures = 0
        while True:
            try:
                objects, version = await self._list()
                self._on_sync(objects)
                failures = 0
                try:
                    async with asyncio.timeout(self._t.resync_s):
                        reason = await self._watch(objects, version)
                except TimeoutError:
                    reason = "resync"
                self.relists[reason] += 1
                log.debug("%s: watch ended (%s), re-listing", self._coll.path, reason)
            except (httpx.HTTPError, KubeApiError, orjson.JSONDecodeError, TimeoutError) as err:
                failures += 1
                self.relists["error"] += 1
                self._on_error(_describe(err))
                await asyncio.sleep(min(self._t.retry_s * 2 ** min(failures - 1, 16), MAX_RETRY_S))

    async def _list(self) -> tuple[dict[str, Mapping[str, Any]], str]:
        resp = await self._client.get(
            self._coll.path,
            params={"labelSelector": self._coll.label_selector},
            timeout=self._t.request_timeout_s,
        )
        if resp.status_code != 200:
            raise KubeApiError(
                f"list {self._coll.path}: HTTP {resp.status_code}: {_status_message(resp.content)}"
            )
        doc = orjson.loads(resp.content)
        version = (doc.get("metadata") or {}).get("resourceVersion")
        if not isinstance(version, str) or not isinstance(doc.get("items"), list):
            raise KubeApiError(f"list {self._coll.path}: not a list (no items or resourceVersion)")
        return {_name(o): o for o in doc["items"]}, version

    async def _watch(self, objects: dict[str, Mapping[str, Any]], version: str) -> str:
        """Apply watch events to `objects` until the watch ends; returns why it ended."""
        params = {
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._t.watch_timeout_s),
            "labelSelector": self._coll.label_selector,
        }
        timeout = httpx.Timeout(self._t.request_timeout_s, read=None)  # the stream may be quiet
        async with self._client.stream("GET", self._coll.path, params=params, timeout=timeout) as resp:
            if resp.status_code == 410:
                return "gone"
            if resp.status_code != 200:
                body = await resp.aread()
                raise KubeApiError(
                    f"watch {self._coll.path}: HTTP {resp.status_code}: {_status_message(body)}"
                )
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return "expired"
                    raise KubeApiError(f"watch {self._coll.path}: {obj.get('message') or obj}")
                if kind == "BOOKMARK":
                    self._on_alive()
                    continue
                if kind in ("ADDED", "MODIFIED"):
                    objects[_name(obj)] = obj
                elif kind == "DELETED":
                    objects.pop(_name(obj), None)
                else:
                    raise KubeApiError(f"watch {self._coll.path}: unknown event type {kind!r}")
                self._on_sync(objects)
        return "closed"


def _name(obj: Mapping[str, Any]) -> str:
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise KubeApiError("an object without metadata.name")
    return name


def _status_message(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace")
    return str(doc.get("message") or doc)[:200] if isinstance(doc, dict) else str(doc)[:200]


def _describe(err: BaseException) -> str:
    if isinstance(err, httpx.HTTPError):
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err)
