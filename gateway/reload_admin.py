"""Admin routes for the config in force and its reload (registered by gateway/admin.py, same guard).

    GET  /admin/config   generation, hash, loaded_at (Unix s), the file, whether it is watched, reload
                         counts by result, the last attempt and the last error (null when none)
    POST /admin/reload   read the config file again and put it in force (gateway/reload.py)

`POST /admin/reload` answers 200 `{"reloaded": true, "generation", "hash", "message"}` when the new
config is in force; 422 (OpenAI's error shape, code `config_invalid` or `restart_required`, plus the
generation and hash still in force) when the file is unreadable, not valid or changes a setting that
needs a restart, in which case nothing changed; 409 (code `no_config_file`) when kvgate was started
without a config file.

With several worker processes (`server.workers`) every worker reloads, and the answer adds
`workers`: for each worker's index, its result (`reloaded`, `generation`, `hash`, and `message` when
it failed), or null for a worker that did not answer. The status and the top-level fields are those
of the worker that took the request; workers that restarted count their generations from 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway.errors import error_body
from gateway.gateway import Gateway

_CODES = {"invalid": "config_invalid", "refused": "restart_required", None: "no_config_file"}


def register_reload_admin(api: FastAPI, guard: Callable[[Request], Gateway]) -> None:
    @api.get("/admin/config")
    async def config_status(request: Request) -> dict[str, Any]:
        return guard(request).reloader.status()

    @api.post("/admin/reload")
    async def reload_config(request: Request) -> Response:
        gw = guard(request)
        res = await gw.reloader.reload("admin")
        workers: dict[str, Any] = {}
        if gw.workers is not None:  # the other worker processes read the file too
            answers = await gw.workers.relay("reload", {"from": gw.workers.index})
            workers = {"workers": {str(gw.workers.index): _result_view(res.ok, res.generation, res.digest)}}
            for i, a in answers.items():
                workers["workers"][str(i)] = (
                    None
                    if a is None
                    else _result_view(bool(a.get("ok")), a.get("generation"), a.get("hash"), a.get("message"))
                )
        request.state.change = (  # for the admin audit line (gateway/admin.py)
            f"config reloaded: generation {res.generation}" if res.ok else f"reload refused: {res.message}"
        )
        if res.ok:
            body = {
                "reloaded": True,
                "generation": res.generation,
                "hash": res.digest,
                "message": res.message,
                **workers,
            }
            return Response(orjson.dumps(body), 200, media_type="application/json")
        status = 409 if res.result is None else 422
        error = orjson.loads(
            error_body(status, res.message, code=_CODES[res.result], type_="invalid_request_error")
        )
        body = {**error, "reloaded": False, "generation": res.generation, "hash": res.digest, **workers}
        return Response(orjson.dumps(body), status, media_type="application/json")


def _result_view(
    ok: bool, generation: int | None, digest: str | None, message: str | None = None
) -> dict[str, Any]:
    view: dict[str, Any] = {"reloaded": ok, "generation": generation, "hash": digest}
    if message is not None and not ok:
        view["message"] = message
    return view
