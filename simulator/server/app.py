"""The ASGI app of one replica: vLLM's routes, `/metrics`, and the simulator's `/sim/*` admin routes.

Routes are a plain table from (method, path) to a handler; unknown paths answer 404 and known paths with
another method 405, with FastAPI's `{"detail": ...}` bodies as vLLM's server does. Errors a client can
cause answer in vLLM's error shape; anything unexpected answers 500 in that shape, never a traceback.

Admin routes (not vLLM's): `GET /sim/faults` (the current faults), `POST /sim/faults` (a JSON object of
fields to change, see `FaultConfig`; answers the new faults), `DELETE /sim/faults` (no faults),
`GET /sim/stats` (the engine's stats as JSON).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from simulator import tokenizer
from simulator.engine import Engine
from simulator.server.adapters import ModelRegistry
from simulator.server.asgi import TEXT, Receive, Scope, Send, read_body, respond, respond_error
from simulator.server.driver import EngineDriver
from simulator.server.errors import ApiError, bad_request
from simulator.server.faults import FaultConfig, FaultState
from simulator.server.generation import GenerationHandler
from simulator.server.metrics import ReplicaMetrics
from simulator.server.openai_schema import parse_json_object, parse_messages

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0+kvgate.sim"

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
_METRICS_TYPE = CONTENT_TYPE_LATEST.encode()


class ReplicaApp:
    """ASGI callable for one replica. Stateless itself; the components it is given own the state."""

    def __init__(self, engine: Engine, driver: EngineDriver, models: ModelRegistry, faults: FaultState,
                 metrics: ReplicaMetrics, generation: GenerationHandler, api_key: str | None = None) -> None:
        self._engine = engine
        self._driver = driver
        self._models = models
        self._faults = faults
        self._metrics = metrics
        # vLLM's --api-key: every /v1/* request needs this exact header (not OPTIONS, not other paths).
        self._auth = None if api_key is None else f"Bearer {api_key}".encode()
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): generation.chat,
            ("POST", "/v1/completions"): generation.completions,
            ("GET", "/v1/models"): self._list_models,
            ("GET", "/health"): self._health,
            ("GET", "/version"): self._version,
            ("GET", "/metrics"): self._render_metrics,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            ("POST", "/v1/load_lora_adapter"): self._load_adapter,
            ("POST", "/v1/unload_lora_adapter"): self._unload_adapter,
            ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
            ("GET", "/sim/faults"): self._get_faults,
            ("POST", "/sim/faults"): self._set_faults,
            ("DELETE", "/sim/faults"): self._clear_faults,
            ("GET", "/sim/stats"): self._stats,
        }
        self._paths = {path for _, path in self._routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if (
            self._auth is not None
            and scope["path"].startswith("/v1")
            and scope["method"] != "OPTIONS"
            and _header(scope, b"authorization") != self._auth
        ):
            await respond(send, 401, b'{"error":"Unauthorized"}')
            return
        handler = self._routes.get((scope["method"], scope["path"]))
        if handler is None:
            if scope["path"] in self._paths:
                await respond(send, 405, b'{"detail":"Method Not Allowed"}')
            else:
                await respond(send, 404, b'{"detail":"Not Found"}')
            return
        try:
            await handler(scope, receive, send)
        except ApiError as error:
            await respond_error(send, error)
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            # If the response had already started, the server closes the connection instead.
            with contextlib.suppress(RuntimeError):
                await respond_error(send, ApiError(500, "Internal server error in the simulator."))

    # -- vLLM's routes ---------------------------------------------------------------------------------

    async def _list_models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, self._models.models_body())

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 503 if self._driver.failed is not None else self._faults.config.health_status
        await respond(send, status, b"", content_type=None)

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, orjson.dumps({"version": VLLM_VERSION}))

    async def _render_metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, self._metrics.render(), content_type=_METRICS_TYPE)

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await _json_body(receive)
        self._check_model(data)
        prompt = data.get("prompt")
        if "messages" in data:
            messages = parse_messages(data["messages"])
            text = tokenizer.render_chat([{"role": m.role, "content": m.content} for m in messages])
        elif isinstance(prompt, str):
            text = prompt
        else:
            raise bad_request("Either 'prompt' (a string) or 'messages' must be given.", "prompt")
        ids = tokenizer.encode(text)
        await respond(send, 200, orjson.dumps({
            "count": len(ids), "max_model_len": self._models.max_model_len, "tokens": ids, "token_strs": None,
        }))

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await _json_body(receive)
        self._check_model(data)
        ids = data.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise bad_request("tokens must be a list of integers.", "tokens")
        try:
            text = tokenizer.decode(ids)
        except ValueError as exc:
            raise bad_request(str(exc), "tokens") from None
        await respond(send, 200, orjson.dumps({"prompt": text}))

    async def _load_adapter(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await _json_body(receive)
        message = self._models.load(data.get("lora_name"), data.get("lora_path"))
        await respond(send, 200, message.encode(), content_type=TEXT)

    async def _unload_adapter(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await _json_body(receive)
        message = self._models.unload(data.get("lora_name"))
        await respond(send, 200, message.encode(), content_type=TEXT)

    async def _reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        if not self._engine.reset_prefix_cache():
            log.warning("prefix cache not reset: blocks are still in use")
        await respond(send, 200, b"", content_type=None)

    # -- the simulator's admin routes ------------------------------------------------------------------

    async def _get_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, orjson.dumps(self._faults.config.as_dict()))

    async def _set_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await _json_body(receive)
        try:
            self._faults.config = self._faults.config.merged(data)
        except (TypeError, ValueError) as exc:
            raise bad_request(str(exc)) from None
        await self._get_faults(scope, receive, send)

    async def _clear_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._faults.config = FaultConfig()
        await self._get_faults(scope, receive, send)

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        stats = self._engine.stats
        body = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else vars(stats)
        await respond(send, 200, orjson.dumps(body, default=list))

    def _check_model(self, data: dict[str, object]) -> None:
        model = data.get("model")
        if model is not None:
            if not isinstance(model, str):
                raise bad_request("model must be a string.", "model")
            self._models.resolve(model)


async def _json_body(receive: Receive) -> dict[str, object]:
    body = await read_body(receive)
    if body is None:
        raise ApiError(400, "The client went away before sending the body.")
    return parse_json_object(body)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None
