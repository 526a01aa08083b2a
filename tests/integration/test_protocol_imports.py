"""The protocol package stays pure: importing it pulls in no ML framework."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import protocol

ROOT = Path(__file__).resolve().parents[2]


def pure_modules() -> list[str]:
    # The NATS client does I/O and is imported explicitly; everything else must stay light.
    return [
        f"protocol.{module.name}"
        for module in pkgutil.iter_modules(protocol.__path__)
        if module.name != "client"
    ]


def test_importing_protocol_does_not_import_torch() -> None:
    modules = ["protocol", *pure_modules()]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "heavy = ('torch', 'transformers', 'sglang', 'nats')\n"
        "assert not [m for m in heavy if m in sys.modules], sorted(sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_pure_modules_are_found() -> None:
    assert {"protocol.codec", "protocol.messages", "protocol.subjects"} <= set(pure_modules())
