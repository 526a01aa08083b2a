"""The TRL peer's ``python`` tool (deploy/peers/trl/grpo_spec.py, ``tool_output``) returns
what Temper's sandbox returns: a warm-up's recovery references show the sandbox's error
text, and the side by side must show TRL's policy the same text for the same code."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from services.domains.tool_use import domain

PEER = Path(__file__).resolve().parents[2] / "deploy" / "peers" / "trl"


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(PEER))
    return importlib.import_module("grpo_spec")


def test_a_failed_call_reads_as_temper_s_sandbox_prints_it(peer: ModuleType) -> None:
    # The sandbox's text for these calls is checked in test_generator_tools.py.
    examples = domain("m", {"task": "modpow", "recovery": 1.0}).examples(3, seed=4)
    for example in examples:
        first = example.reference.split("\n")[0]
        call = json.loads(first.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        done = subprocess.run(
            [sys.executable, "-I", "-c", call["arguments"]["code"]],
            capture_output=True,
            text=True,
            check=False,
        )
        assert "NameError" in done.stderr
        assert peer.tool_output(done.stdout, done.stderr) == example.tool_outputs[0]
    assert peer.tool_output("5\n", "") == "5\n"
