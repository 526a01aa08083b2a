"""Components the tests need from this machine: skipped where absent, but a failure in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required(flag: str) -> bool:
    """Whether a missing component fails the run: in CI (CI=true) or when ``flag``=1."""
    return os.environ.get("CI") == "true" or os.environ.get(flag) == "1"


def unavailable(component: str, reason: str, *, flag: str) -> NoReturn:
    if required(flag):
        pytest.fail(f"{component} is required here (CI) but {reason}")
    pytest.skip(reason)
