"""The weight transport benchmark on the session's CPU SGLang server, one round of each
(its figures are printed, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.engines.sglang.server import SGLangServer
from tests.benches import load_bench

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_one_round_of_each_prints_every_figure(
    sglang_server: SGLangServer, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("bench_weight_transport")
    argv = ["--rounds", "1", "--server", sglang_server.url, "--model", str(tiny_model)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "1 rounds of each, disk first" in out
    assert "round 1 disk" in out and "round 1 distributed" in out
    assert "update_weights_from_disk" in out and "update_weights_from_distributed" in out
    for figure in ("disk        publication -> serving", "ratio distributed/disk per round"):
        assert figure in out
    assert "distributed median ms: export" in out and "broadcast (overlaps)" in out
