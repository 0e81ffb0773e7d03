"""Where kvgate's log lines go when it runs as a server (`kvgate serve`, `kvgate up`).

- kvgate's own loggers (`gateway.*`, `simulator.*`): stderr, `server.log_level` and up, one line each
  (`time level logger: message`).
- the access log (`kvgate.access`, gateway/access_log.py): stdout, one JSON object per line, when
  `server.access_log` is on; off, the logger stays below INFO and no line is even built.

uvicorn configures its own loggers afterwards without disabling these. Tests and embedding code that
do not call `configure` get Python's defaults (warnings and errors on stderr, no access lines).
"""

from __future__ import annotations

import logging
import sys

from gateway.access_log import ACCESS_LOGGER
from gateway.config import ServerConfig

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(server: ServerConfig) -> None:
    """Install kvgate's handlers (idempotent: a second call replaces the first's)."""
    level = getattr(logging, server.log_level.upper())
    errors = logging.StreamHandler(sys.stderr)
    errors.setFormatter(logging.Formatter(_FORMAT))
    for name in ("gateway", "simulator"):
        logger = logging.getLogger(name)
        logger.handlers = [errors]
        logger.setLevel(level)
        logger.propagate = False
    access = logging.getLogger(ACCESS_LOGGER)
    access.propagate = False
    if server.access_log:
        lines = logging.StreamHandler(sys.stdout)
        lines.setFormatter(logging.Formatter("%(message)s"))
        access.handlers = [lines]
        access.setLevel(logging.INFO)
    else:
        access.handlers = []
        access.setLevel(logging.WARNING)
