"""Process-wide log configuration (services/runtime/logs.py)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from services.runtime import logs


@pytest.fixture
def restored() -> Iterator[None]:
    config = structlog.get_config()
    yield
    structlog.configure(**config)
    structlog.contextvars.clear_contextvars()


def test_lines_follow_stderr_when_it_is_swapped_and_the_old_one_closed(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    logs.configure("svc", level="info")
    log = logs.get_logger(component="test")
    log.info("one")  # the logger is cached here, on first use
    monkeypatch.setattr("sys.stderr", second)
    first.close()  # as a test harness closes its capture
    log.info("two")
    assert json.loads(second.getvalue())["event"] == "two"
    assert json.loads(second.getvalue())["service"] == "svc"


def test_an_explicit_stream_is_kept(restored: None) -> None:
    out = io.StringIO()
    logs.configure("svc", level="warning", stream=out)
    log = logs.get_logger()
    log.info("filtered")
    log.warning("kept", n=1)
    [line] = out.getvalue().splitlines()
    assert json.loads(line)["event"] == "kept"


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        logs.configure("svc", level="loud")


class _Writes(io.StringIO):
    """Each ``write`` call as it came: an unbuffered stream makes each one a syscall."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_each_line_is_one_write_with_its_newline(restored: None) -> None:
    out = _Writes()
    logs.configure("svc", level="info", stream=out)
    logs.get_logger().info("first")
    logs.get_logger().info("second")
    assert len(out.calls) == 2, out.calls
    assert all(call.endswith("\n") and call.count("\n") == 1 for call in out.calls)
