"""structlog set-up: key-value logs, JSON in production, readable on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(*, json: bool | None = None, level: str = "info") -> None:
    """Configure structlog once per process.

    ``json=None`` picks JSON unless stderr is a terminal.
    """
    if json is None:
        json = not sys.stderr.isatty()
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(component=name)
    return logger
