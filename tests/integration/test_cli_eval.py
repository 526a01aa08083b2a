"""``temper eval`` through a real evaluation stack (nats-server, torch-engine generator,
validator, and the sandbox service on the Docker engine) on two small domains, one of
them multi-turn with a python tool; then ``--compare`` on the report it wrote."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from tests.integration.test_cli_harness import ENV, ROOT, Done, finish
from tests.unit.test_eval_compare import planted_domain, planted_report

DOMAINS = ("arithmetic_sum3", "tool_use")
SAMPLES = 2
LIMIT = 8


async def temper_eval(image: str, *argv: str, timeout_s: float) -> Done:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services",
        "eval",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**ENV, "TEMPER_SANDBOX_IMAGE": image},
    )
    return await finish(proc, timeout_s)


@pytest.mark.timeout(600)
async def test_eval_reports_unit_chain_and_system_tiers(
    tmp_path: Path, tool_policy: Path, sandbox_image: str
) -> None:
    out = tmp_path / "report"
    done = await temper_eval(
        sandbox_image,
        "--policy",
        str(tool_policy),
        "--domains",
        ",".join(DOMAINS),
        "--samples",
        str(SAMPLES),
        "--limit",
        str(LIMIT),
        "--out",
        str(out),
        "--sandbox-backend",
        "docker",
        timeout_s=480,
    )
    assert done.code == 0, done.out + done.err
    report = json.loads((out / "report.json").read_text())
    page = (out / "report.html").read_text()
    assert "arithmetic_sum3" in page and "tool_use" in page
    assert "arithmetic_sum3" in (out / "report.md").read_text()
    assert report["received_rollouts"] == report["expected_rollouts"] == 2 * LIMIT * 3
    assert set(report["domains"]) == set(DOMAINS)
    arithmetic, tools = report["domains"]["arithmetic_sum3"], report["domains"]["tool_use"]
    for domain in (arithmetic, tools):
        assert domain["problems"] == LIMIT and domain["rollouts"] == LIMIT * (1 + SAMPLES)
        unit, system = domain["unit"], domain["system"]
        assert unit["k"] == SAMPLES
        assert 0.0 <= unit["pass_at_1"]["low"] <= unit["pass_at_1"]["high"] <= 1.0
        assert unit["pass_at_k"]["value"] >= unit["pass_at_1"]["value"] - 1e-9
        assert 0 < system["latency_s"]["p50"] <= system["latency_s"]["p99"]
        assert system["cost_per_task"]["prompt_tokens"] > 0
        assert system["cost_per_task"]["generator_s"] > 0
    assert arithmetic["chain"] is None, "single-turn: no chain tier"
    chain = tools["chain"]
    # The warmed policy calls the python tool: turns beyond the first, run in the sandbox.
    assert chain["attempts"]["mean"] > 0.5 and chain["turns"]["mean"] > 1.0, chain
    assert tools["unit"]["tool_format"] is not None
    assert tools["system"]["cost_total"]["sandbox_s"] > 0
    assert "tool_use: pass@1" in done.out and "turns" in done.out


async def test_compare_flags_a_planted_regression(tmp_path: Path) -> None:
    before = planted_report(
        planted_domain("arithmetic_sum3", 200, 3, 0.9), planted_domain("tool_use", 200, 3, 0.5)
    )
    after = planted_report(
        planted_domain("arithmetic_sum3", 200, 3, 0.2), planted_domain("tool_use", 200, 3, 0.52)
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps(before))
    (tmp_path / "b.json").write_text(json.dumps(after))
    done = await temper_eval(
        "unused", "--compare", str(tmp_path / "a"), str(tmp_path / "b.json"), timeout_s=60
    )
    assert done.code == 1, done.out + done.err
    flagged = [line for line in done.out.splitlines() if "REGRESSION" in line.upper()]
    assert any(line.startswith("arithmetic_sum3") for line in flagged), done.out
    assert not [line for line in flagged if "tool_use" in line], "noise is not a regression"
    same = await temper_eval(
        "unused", "--compare", str(tmp_path / "a"), str(tmp_path / "a"), timeout_s=60
    )
    assert same.code == 0, same.out + same.err
