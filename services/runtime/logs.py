"""structlog JSON logs.  Every line carries the service; handlers add trace and task ids."""

from __future__ import annotations

import io
import logging
import sys
from typing import TextIO, cast

import structlog


class CurrentStderr(io.TextIOBase):
    """Whatever ``sys.stderr`` is at each write.

    Loggers are cached on first use; one that kept the stderr of the moment would write to
    a closed file once that is swapped out and closed (a test harness capturing output,
    a daemonizing wrapper), and the write error would take the service down.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(service: str, level: str = "info", stream: TextIO | None = None) -> None:
    """Called once by the process entry point (the CLI), never by library code.

    Without ``stream``, lines go to the process's stderr as it is when each is written.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    stream = stream or cast(TextIO, CurrentStderr())
    logging.basicConfig(level=numeric, stream=stream, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # One write per line, newline included: processes sharing a stream (torchrun's
        # ranks share their parent's stdout) under PYTHONUNBUFFERED would otherwise
        # interleave a line's text and its newline with another process's line.
        logger_factory=structlog.WriteLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(**bound: object) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(**bound)  # type: ignore[no-any-return]
