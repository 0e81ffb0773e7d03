"""Hot reload: one function reads the config again, checks it in full and puts it in force at once.

SIGHUP, `POST /admin/reload` and the config watch (gateway/config_file.py) all call
`ConfigReloader.reload(trigger)`, which returns a `ReloadResult` (ok, generation, digest, message).
One reload runs at a time; a second waits for the first.

The protocol. A component that takes part implements `Reconfigurable.prepare(old, new)`: build
everything the new config needs from it (compile tenants, build profiles, read credentials) WITHOUT
changing anything, or raise ConfigError (`path: reason`); it returns a `ReloadStep`:

- `commit()`: swap the prepared parts in. Synchronous, cannot fail, changes only what `new` decides
  (state that survives a reload — buckets, the prefix index, queues, fleet membership — stays put).
- `settle()` (optional, async): work that follows the swap and may take time, such as restarting a
  discovery source (its first sync is awaited) or clearing shared overrides in a store.

A reload runs: load the file (off the loop) -> refuse restart-only changes (gateway/reload_scope.py)
-> every component's `prepare`, in order -> every `commit`, in the same order, with no await in
between, then the new `ConfigSnapshot` is published -> every `settle`, in order. Since the commits
and the publication run without yielding to the event loop, no request ever sees half a reload: one
that arrives after it sees all of it, one that arrived before keeps the snapshot and the tenant it
started with. A failure before the commits leaves everything as it was: the error is logged, counted
(`kvgate_config_reloads_total{result="invalid"|"refused"}`) and kept for `GET /admin/config`. A
`settle` that fails is logged; the config it belongs to is in force already.

The order components are called in is the Gateway's (`Gateway.reload_components`); what each takes
is listed in gateway/reload_scope.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.config import Config, ConfigError
from gateway.config_file import ConfigFile
from gateway.config_snapshot import ConfigSnapshot
from gateway.reload_scope import changed_paths, restart_needed

log = logging.getLogger(__name__)

Result = Literal["ok", "invalid", "refused"]
RESULTS: tuple[Result, ...] = ("ok", "invalid", "refused")


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class ReloadStep:
    """What a component's `prepare` hands back (see the module doc)."""

    commit: Callable[[], None] = _nothing
    settle: Callable[[], Awaitable[None]] | None = None


class Reconfigurable(Protocol):
    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Build what `new` needs, change nothing; raise ConfigError if `new` cannot be used."""
        ...


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """`generation` and `digest` are the config in force after the attempt (the old one on failure)."""

    ok: bool
    generation: int
    digest: str
    message: str
    result: Result | None = None  # None: nothing was attempted (no config file)


@dataclass(frozen=True, slots=True)
class _Attempt:
    trigger: str
    at: float  # Unix seconds
    result: Result
    message: str


class ConfigReloader:
    """Owns the reload sequence and its record. `publish` puts a new snapshot in force (the Gateway
    assigns it to its `snapshot` attribute); `components` are (name, component) in call order."""

    def __init__(
        self,
        first: ConfigSnapshot,
        components: Sequence[tuple[str, Reconfigurable]],
        publish: Callable[[ConfigSnapshot], None],
        source: ConfigFile | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.current = first
        self.source = source
        self._components = list(components)
        self._publish = publish
        self._wall_clock = wall_clock
        self._lock = asyncio.Lock()
        self._counts: dict[Result, int] = dict.fromkeys(RESULTS, 0)
        self.last: _Attempt | None = None
        self.last_error: _Attempt | None = None

    async def reload(self, trigger: str) -> ReloadResult:
        """Read the config file again and put it in force (module doc). Never raises for a bad file."""
        source = self.source
        if source is None:
            return self._nothing_to_do("kvgate was started without a config file: there is nothing to reload")
        async with self._lock:
            try:
                new = await asyncio.to_thread(source.load)
            except ConfigError as err:
                return self._failed(trigger, "invalid", f"{err}")
            return await self._apply(new, trigger)

    async def _apply(self, new: Config, trigger: str) -> ReloadResult:
        """Refuse, prepare, commit, publish, settle (module doc); under the lock."""
        old = self.current.config
        refused = restart_needed(old, new)
        if refused:
            return self._failed(
                trigger,
                "refused",
                "these settings need a restart, so nothing was changed: " + "; ".join(refused),
            )
        try:
            steps = [component.prepare(old, new) for _, component in self._components]
        except (ConfigError, ValueError) as err:
            return self._failed(trigger, "invalid", f"{err}")
        # From here to the publication: no await, so no request sees part of the new config.
        for step in steps:
            step.commit()
        snapshot = ConfigSnapshot.of(new, self.current.generation + 1, self._wall_clock())
        self.current = snapshot
        self._publish(snapshot)
        for (name, _), step in zip(self._components, steps, strict=True):
            if step.settle is not None:
                try:
                    await step.settle()
                except Exception:
                    log.exception("config reload: %s failed to settle after the swap", name)
        changed = changed_paths(old, new)
        message = "changed: " + (", ".join(changed) if changed else "nothing (the file was applied again)")
        self._record(trigger, "ok", message)
        log.info(
            "config reload (%s): generation %d, hash %s in force; %s",
            trigger, snapshot.generation, snapshot.digest, message,
        )  # fmt: skip
        return ReloadResult(True, snapshot.generation, snapshot.digest, message, "ok")

    def _failed(self, trigger: str, result: Result, message: str) -> ReloadResult:
        cur = self.current
        self.last_error = self._record(trigger, result, message)
        log.error(
            "config reload (%s) %s; generation %d (hash %s) stays in force: %s",
            trigger, "refused" if result == "refused" else "failed", cur.generation, cur.digest, message,
        )  # fmt: skip
        return ReloadResult(False, cur.generation, cur.digest, message, result)

    def _nothing_to_do(self, message: str) -> ReloadResult:
        log.warning("config reload: %s", message)
        return ReloadResult(False, self.current.generation, self.current.digest, message)

    def _record(self, trigger: str, result: Result, message: str) -> _Attempt:
        self._counts[result] += 1
        self.last = _Attempt(trigger, self._wall_clock(), result, message)
        return self.last

    # -- views ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The config in force and the last attempts, for `GET /admin/config` (JSON-ready)."""
        cur = self.current
        return {
            "generation": cur.generation,
            "hash": cur.digest,
            "loaded_at": cur.loaded_at,
            "file": None if self.source is None else str(self.source.path),
            "watch": cur.config.server.watch_config and self.source is not None,
            "reloads": dict(self._counts),
            "last_reload": _view(self.last),
            "last_error": _view(self.last_error),
        }

    def collect(self) -> Iterable[Metric]:
        """Generation, digest and reload counts, for a scrape-time callback."""
        cur = self.current
        yield GaugeMetricFamily(
            "kvgate_config_generation",
            "Configs put in force by this process (1: the one it started with; +1 per good reload).",
            value=cur.generation,
        )
        info = GaugeMetricFamily(
            "kvgate_config_info", "The config in force: its hash (of the settings, not the file's text).",
            labels=["hash"],
        )  # fmt: skip
        info.add_metric([cur.digest], 1.0)
        yield info
        reloads = CounterMetricFamily(
            "kvgate_config_reloads",
            "Config reloads by result: ok, invalid (unreadable, not YAML, fails a check; the last good "
            "config stays), refused (a setting that needs a restart changed; nothing changed).",
            labels=["result"],
        )
        for result in RESULTS:
            reloads.add_metric([result], self._counts[result])
        yield reloads


def _view(attempt: _Attempt | None) -> dict[str, Any] | None:
    if attempt is None:
        return None
    return {
        "trigger": attempt.trigger,
        "at": attempt.at,
        "result": attempt.result,
        "message": attempt.message,
    }
