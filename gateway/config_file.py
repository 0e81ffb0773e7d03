"""The config file a running kvgate reloads from, and the watch that reloads it when it changes.

`ConfigFile.load()` reads the file, checks it exactly as start-up did (`checked_from_text`: schema,
then semantics) and applies the command's own adjustment (`kvgate up` puts its simulated replicas in
a file that names none). It remembers the digest of the bytes it last tried, good or not.

`ConfigWatch` looks at the file every `server.watch_config_interval_s` while `server.watch_config`
is on (both read from the config in force at each look, so turning the watch on or off is itself a
reload): a look that finds the same inode, device, size and modification time as the last one reads
nothing; otherwise the bytes are read and hashed, and only content that differs from what the last
reload tried starts a reload. So an in-place edit, a `mv` over the file and a ConfigMap's `..data`
symlink swap are each noticed within one interval, a broken file is one failed reload (not one per
look), and a reload by SIGHUP or the admin API is not repeated by the watch. The discovery file
source (gateway/discovery/file_source.py) polls differently on purpose: it compares with the last
GOOD content, so a broken replicas file keeps failing its source until fixed, and the source goes
stale; here the config in force stays and the error is reported once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.config import Config, ConfigError, ServerConfig
from gateway.config_check import checked_from_text

log = logging.getLogger(__name__)


def content_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ConfigFile:
    """Where a reload reads the config from. `adjust` (optional) turns the file's config into the
    one kvgate runs (it must be pure and cheap: it runs on every reload)."""

    def __init__(self, path: str | Path, adjust: Callable[[Config], Config] | None = None) -> None:
        self.path = Path(path)
        self.adjust = adjust
        self.last_digest: str | None = None  # of the bytes the last load() tried

    def read(self) -> bytes:
        """The file's bytes now (follows symlinks). Raises ConfigError when it cannot be read."""
        try:
            return self.path.read_bytes()
        except OSError as err:
            raise ConfigError(f"{self.path}: cannot read: {err.strerror or err}") from None

    def load(self) -> Config:
        """Read and check the file as start-up did. Raises ConfigError (`path: reason` lines).
        Blocking (reads a file): run it off the event loop."""
        data = self.read()
        self.last_digest = content_digest(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"{self.path}: not UTF-8 text: {err.reason} at byte {err.start}") from None
        config = checked_from_text(text, str(self.path))
        return self.adjust(config) if self.adjust is not None else config

    def signature(self) -> tuple[int, int, int, int] | None:
        """(inode, device, size, mtime ns) of the file now, None when it cannot be stat'ed."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


class ConfigWatch:
    """Reloads `source` through `reload` when its content changes (see the module doc). One task,
    started and stopped by its owner; `looks` counts finished looks (tests wait in looks, not time)."""

    def __init__(
        self,
        source: ConfigFile,
        settings: Callable[[], ServerConfig],
        reload: Callable[[str], Awaitable[Any]],
    ) -> None:
        self._source = source
        self._settings = settings  # the server section in force, read at each look
        self._reload = reload
        self._signature: tuple[int, int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self.looks = 0

    def start(self) -> None:
        self._signature = self._source.signature()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kvgate-config-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def look(self) -> bool:
        """One look; True when it started a reload."""
        signature = self._source.signature()
        if signature is None or signature == self._signature:
            return False
        self._signature = signature
        try:
            data = await asyncio.to_thread(self._source.read)
        except ConfigError:
            return False  # gone between the stat and the read (a swap in progress): the next look
        if content_digest(data) == self._source.last_digest:
            return False
        log.info("config watch: %s changed, reloading", self._source.path)
        await self._reload("watch")
        return True

    async def _run(self) -> None:
        while True:
            server = self._settings()
            await asyncio.sleep(server.watch_config_interval_s)
            if not self._settings().watch_config:
                continue
            try:
                await self.look()
            except Exception:  # a look must never end the watch
                log.exception("config watch: looking at %s failed", self._source.path)
            self.looks += 1
