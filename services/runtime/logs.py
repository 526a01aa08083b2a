"""structlog JSON logs.  Every line carries the service; handlers add trace and task ids."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure(service: str, level: str = "info", stream: TextIO | None = None) -> None:
    """Called once by the process entry point (the CLI), never by library code."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    logging.basicConfig(level=numeric, stream=stream or sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(**bound: object) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(**bound)  # type: ignore[no-any-return]
