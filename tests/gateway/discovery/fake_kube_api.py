"""A fake Kubernetes API server on loopback: list and watch of one namespace's EndpointSlices and Pods.

No cluster can run on these machines (no container runtime, no kind or k3s, no network), so kvgate's
Kubernetes discovery is tested against this hand-written server on its main path. It speaks the
real list/watch protocol as the Kubernetes API reference and "Efficient detection of changes"
describe it:

- `GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices` and `GET /api/v1/namespaces/NS/pods`
  with `labelSelector` (equality-based, `k=v,k2=v2`): a List with `metadata.resourceVersion`;
- the same with `watch=1&resourceVersion=RV`: a chunked stream of JSON lines `{type, object}`, first
  the events after RV, then new ones as they happen; `BOOKMARK` events (an object of the watched kind
  carrying only `metadata.resourceVersion`) when `allowWatchBookmarks=true`; the stream ends after
  `timeoutSeconds`;
- a resourceVersion older than the compacted history: an `ERROR` event whose object is a `Status`
  with code 410 (reason Expired), as the API server sends for a watch; or, when `gone_as_http`, an
  HTTP 410 with that Status as the body;
- `Authorization: Bearer TOKEN` required (401 Status otherwise).

Test controls: `put` (ADDED/MODIFIED), `delete` (DELETED; `silently=True` drops the object with no
event, as a watch that resumed at the wrong point loses one), `compact` (history before now is
gone), `bookmark`, `drop_watches` (connections cut mid-stream), and counters of lists and watches.

Every object it serves — stored objects, lists, watch events, Status — is validated against the
Kubernetes OpenAPI schemas (strict) shipped by `kubernetes-validate`, so the shapes are the real
ones, not what kvgate happens to accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import orjson
from aiohttp import web
from jsonschema import Draft202012Validator
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

K8S_VERSION = kubernetes_validate.latest_version()
SLICES = "endpointslices"
PODS = "pods"
_KINDS = {
    SLICES: ("discovery.k8s.io/v1", "EndpointSlice"),
    PODS: ("v1", "Pod"),
}


def _meta_validator(name: str) -> Draft202012Validator:
    """A validator for a meta/v1 schema (Status, WatchEvent), which kubernetes-validate's
    `validate` cannot pick by kind: they are not top-level resources."""
    folder = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict"
    schema = schema_contents(f"{folder}/{name}.json", K8S_VERSION)
    defs = schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    registry: Registry[Any] = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return Draft202012Validator(schema, registry=registry)


_STATUS = _meta_validator("status-meta-v1")
_WATCH_EVENT = _meta_validator("watchevent-meta-v1")


def validate(obj: Mapping[str, Any]) -> None:
    """Raise unless `obj` is valid for its kind (strict: no unknown fields)."""
    if obj.get("kind") == "Status":
        _STATUS.validate(obj)
    else:
        kubernetes_validate.validate(dict(obj), K8S_VERSION, strict=True)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    s = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    validate(s)
    return s


def endpoint_slice(
    name: str,
    service: str,
    endpoints: list[dict[str, Any]],
    port: int,
    namespace: str = "inference",
) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            "generateName": f"{service}-",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Service", "name": service, "uid": f"uid-svc-{service}",
                 "controller": True, "blockOwnerDeletion": True}
            ],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }  # fmt: skip


def endpoint(
    pod: str, ip: str, *, ready: bool = True, terminating: bool = False, namespace: str = "inference"
) -> dict[str, Any]:
    """One endpoint of a slice; `serving` follows `ready` unless terminating (then it may still serve)."""
    return {
        "addresses": [ip],
        "conditions": {"ready": ready and not terminating, "serving": ready, "terminating": terminating},
        "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": f"uid-{pod}"},
        "nodeName": "gpu-node-1",
        "zone": "zone-a",
    }


def pod(
    name: str,
    ip: str | None,
    labels: Mapping[str, str],
    *,
    ready: bool = True,
    phase: str = "Running",
    deleting: bool = False,
    namespace: str = "inference",
) -> dict[str, Any]:
    """A Pod of a vLLM Deployment, as the kubelet reports it."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "uid": f"uid-{name}",
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T10:00:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    status_: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
        ],
    }
    if ip is not None:
        status_["podIP"] = ip
        status_["podIPs"] = [{"ip": ip}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [
                {"name": "vllm", "image": "vllm/vllm-openai:latest",
                 "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]}
            ],
        },
        "status": status_,
    }  # fmt: skip


@dataclass(eq=False)
class _Watcher:
    collection: str
    selector: dict[str, str]
    bookmarks: bool
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    request: web.BaseRequest | None = None


class FakeKubeApi:
    """The server (see the module doc). `async with FakeKubeApi() as api: api.url`."""

    def __init__(self, namespace: str = "inference", token: str = "kvgate-test-token") -> None:
        self.namespace = namespace
        self.token = token
        self.gone_as_http = False  # 410 as an HTTP status on the watch request, not an ERROR event
        self.expire_next_watch = False  # the next watch request is told 410, whatever its version
        self._rv = itertools.count(100)
        self.resource_version = next(self._rv)
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, collection, type, object)
        self._compacted = 0  # watches from a version below this get 410
        self._watchers: set[_Watcher] = set()
        self.lists: dict[str, int] = {SLICES: 0, PODS: 0}
        self.watches: dict[str, int] = {SLICES: 0, PODS: 0}
        self.unauthorized = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> FakeKubeApi:
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._slices)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- test controls --------------------------------------------------------------------------

    def put(self, collection: str, obj: dict[str, Any]) -> int:
        """Create or replace an object (ADDED or MODIFIED); returns its new resourceVersion."""
        obj = copy.deepcopy(obj)
        name = obj["metadata"]["name"]
        key = (collection, name)
        kind = "MODIFIED" if key in self._objects else "ADDED"
        meta = obj["metadata"]
        meta["namespace"] = self.namespace
        meta.setdefault("uid", f"uid-{collection}-{name}")
        meta.setdefault("creationTimestamp", "2026-12-05T09:00:00Z")
        rv = self.resource_version = next(self._rv)
        meta["resourceVersion"] = str(rv)
        validate(obj)
        self._objects[key] = obj
        self._emit(rv, collection, kind, obj)
        return rv

    def delete(self, collection: str, name: str, *, silently: bool = False) -> None:
        """Delete an object: a DELETED event, or (`silently`) no event at all (a lost event)."""
        obj = self._objects.pop((collection, name))
        rv = self.resource_version = next(self._rv)
        if not silently:
            gone = copy.deepcopy(obj)
            gone["metadata"]["resourceVersion"] = str(rv)
            self._emit(rv, collection, "DELETED", gone)

    def compact(self) -> None:
        """Forget the history up to now: a watch from any version before now is told 410 Gone."""
        self.resource_version = next(self._rv)
        self._compacted = self.resource_version
        self._history.clear()

    def expire_watches(self) -> None:
        """Tell every open watch its resourceVersion is gone (an ERROR event, Status 410), then end it,
        as the API server does when a lagging watch falls behind the compacted history."""
        self.compact()
        for w in self._watchers:
            gone = status(410, "Expired", f"too old resource version ({self._compacted})")
            w.queue.put_nowait(self._event("ERROR", gone))
            w.queue.put_nowait(None)

    def bookmark(self) -> None:
        """Send every watcher that asked for bookmarks a BOOKMARK at the current resourceVersion."""
        for w in self._watchers:
            if w.bookmarks:
                api_version, kind = _KINDS[w.collection]
                obj = {"kind": kind, "apiVersion": api_version,
                       "metadata": {"resourceVersion": str(self.resource_version)}}  # fmt: skip
                w.queue.put_nowait(self._event("BOOKMARK", obj))

    async def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream (no end of the chunked body)."""
        for w in list(self._watchers):
            if w.request is not None and w.request.transport is not None:
                w.request.transport.abort()
            w.queue.put_nowait(None)
        await asyncio.sleep(0)

    def open_watches(self, collection: str) -> int:
        return sum(1 for w in self._watchers if w.collection == collection)

    # -- the API --------------------------------------------------------------------------------

    async def _slices(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, SLICES)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, PODS)

    async def _serve(self, request: web.Request, collection: str) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            return _json(status(401, "Unauthorized", "Unauthorized"), 401)
        if request.match_info["ns"] != self.namespace:
            api_version, kind = _KINDS[collection]
            meta = {"resourceVersion": str(self.resource_version)}
            return _json({"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": []})
        selector = _parse_selector(request.query.get("labelSelector", ""))
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request, collection, selector)
        self.lists[collection] += 1
        api_version, kind = _KINDS[collection]
        items = [
            o for (c, _), o in sorted(self._objects.items()) if c == collection and _matches(o, selector)
        ]
        body = {
            "kind": f"{kind}List",
            "apiVersion": api_version,
            "metadata": {"resourceVersion": str(self.resource_version)},
            "items": items,
        }
        validate(body)
        return _json(body)

    async def _watch(
        self, request: web.Request, collection: str, selector: dict[str, str]
    ) -> web.StreamResponse:
        self.watches[collection] += 1
        since = int(request.query["resourceVersion"])
        timeout_s = float(request.query.get("timeoutSeconds", "1800"))
        expired = since < self._compacted or self.expire_next_watch
        self.expire_next_watch = False
        if expired:
            gone = status(410, "Expired", f"too old resource version: {since} ({self._compacted})")
            if self.gone_as_http:
                return _json(gone, 410)
        w = _Watcher(collection, selector, request.query.get("allowWatchBookmarks") == "true")
        w.request = request
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if expired:
            await resp.write(orjson.dumps(self._event("ERROR", gone)) + b"\n")
            await resp.write_eof()
            return resp
        for rv, c, kind, obj in self._history:
            if rv > since and c == collection and _matches(obj, selector):
                await resp.write(orjson.dumps(self._event(kind, obj)) + b"\n")
        self._watchers.add(w)
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    event = await w.queue.get()
                    if event is None:
                        break  # dropped (the transport is already gone) or expired
                    await resp.write(orjson.dumps(event) + b"\n")
        except TimeoutError:
            pass  # timeoutSeconds: the server ends the watch cleanly
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        finally:
            self._watchers.discard(w)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    def _emit(self, rv: int, collection: str, kind: str, obj: dict[str, Any]) -> None:
        self._history.append((rv, collection, kind, obj))
        for w in self._watchers:
            if w.collection == collection and _matches(obj, w.selector):
                w.queue.put_nowait(self._event(kind, obj))

    @staticmethod
    def _event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        event = {"type": kind, "object": obj}
        _WATCH_EVENT.validate(event)
        if kind not in ("BOOKMARK", "ERROR"):
            validate(obj)
        return event


def _json(body: Mapping[str, Any], status_code: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status_code, content_type="application/json")


def _parse_selector(text: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"only equality-based selectors here, got {part!r}")
        out[key.strip()] = value.lstrip("=").strip()
    return out


def _matches(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())
