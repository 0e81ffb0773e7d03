"""The replicas file: a YAML list in the `replicas:` format, re-read every `interval_s`.

The whole file is read on every poll (it is small) and compared with the last good content, so an
in-place edit and an atomic rename (a ConfigMap's `..data` symlink swap, `mv new replicas.yaml`) are
both noticed within one interval, whatever their timestamps. A file that cannot be read, is not
YAML, does not validate, or is empty (the moment between a truncate and a write) keeps the last
good list; an explicit empty list (`[]`) means no replicas.

File replicas wait for their model (`/v1/models`) before they are ready, like every discovered one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from gateway.config import ReplicaConfig
from gateway.config_discovery import FileDiscoveryConfig
from gateway.discovery.reconciler import Reconciler
from gateway.fleet.membership import ReplicaSpec

SOURCE = "file"
MAX_BYTES = 1 << 20  # a replicas file is a few KB; anything this big is not one
_REPLICAS = TypeAdapter(tuple[ReplicaConfig, ...])


class ReplicasFileError(ValueError):
    """The file's content is not a usable replicas list; the message says where and why."""


def parse_replicas_file(text: str, *, slow_start_s: float = 0.0) -> dict[str, ReplicaSpec]:
    """The specs of a replicas file's text (name -> spec). Raises ReplicasFileError."""
    if not text.strip():
        raise ReplicasFileError("the file is empty (being written?); write [] for no replicas")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ReplicasFileError(f"not valid YAML: {err}") from None
    if not isinstance(data, list):
        raise ReplicasFileError("the top level must be a list in the `replicas:` format")
    try:
        replicas = _REPLICAS.validate_python(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = "[" + "].".join(str(p) for p in e["loc"]) if e["loc"] else "(top level)"
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {msg}")
        raise ReplicasFileError("; ".join(problems)) from None
    specs: dict[str, ReplicaSpec] = {}
    for r in replicas:
        if r.display_name in specs:
            raise ReplicasFileError(f"duplicate replica name {r.display_name!r}")
        specs[r.display_name] = ReplicaSpec.from_config(
            r, source=SOURCE, await_model=True, slow_start_s=slow_start_s
        )
    return specs


def _read(path: Path) -> bytes:
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ReplicasFileError(f"larger than {MAX_BYTES} bytes")
    return data


class FileSource:
    """Polls one replicas file and reports its list to the reconciler (see the module doc)."""

    name = SOURCE

    def __init__(
        self, cfg: FileDiscoveryConfig, reconciler: Reconciler, *, slow_start_s: float = 0.0
    ) -> None:
        self._cfg = cfg
        self._path = Path(cfg.path)
        self._reconciler = reconciler
        self._slow_start_s = slow_start_s
        self._good: bytes | None = None  # the content of the last good read
        self.polls = 0  # polls finished (tests count intervals with it)
        self.synced = asyncio.Event()  # set after the first poll, good or not

    async def run(self) -> None:
        """Poll forever (until cancelled)."""
        while True:
            await self.poll()
            self.polls += 1
            self.synced.set()
            await asyncio.sleep(self._cfg.interval_s)

    async def poll(self) -> Mapping[str, ReplicaSpec] | None:
        """One read; returns the new set when it changed, else None."""
        try:
            data = await asyncio.to_thread(_read, self._path)
        except OSError as err:
            self._reconciler.failed(self.name, f"cannot read {self._path}: {err.strerror or err}")
            return None
        except ReplicasFileError as err:
            self._reconciler.failed(self.name, f"{self._path}: {err}")
            return None
        if data == self._good:
            self._reconciler.touch(self.name)
            return None
        try:
            specs = parse_replicas_file(data.decode("utf-8", "replace"), slow_start_s=self._slow_start_s)
        except ReplicasFileError as err:
            self._reconciler.failed(self.name, f"{self._path}: {err}")
            return None
        self._good = data
        self._reconciler.update(self.name, specs)
        return specs
