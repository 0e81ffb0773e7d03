"""Replacing a file whole: a reader (another process polling it) sees the old content or the new,
never a truncated or half-written file, and a writer stopped mid-write leaves the old file intact."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: written to a temporary file beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
