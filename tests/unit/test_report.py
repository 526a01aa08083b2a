"""``temper report``: a run directory in, one self-contained HTML page (or markdown) out."""

from __future__ import annotations

import base64
import io
import json
import struct
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from services.cli import main
from services.evaluation.report.build import SECTION_IDS
from services.evaluation.report.run_data import load

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS = 30
HEALTHY, HACKED = "alpha", "beta"


# ---------------------------------------------------------------- a run directory


def interval(value: float, n: int = 200) -> dict[str, float | int]:
    return {"value": value, "low": max(0.0, value - 0.05), "high": min(1.0, value + 0.05), "n": n}


def domain_tiers(
    *,
    greedy: float,
    infra: float = 0.0,
    tokens: float = 20.0,
    format_score: float = 1.0,
    chain: bool = False,
) -> dict[str, Any]:
    """One domain of a tier report (schema 1)."""
    chain_tier = {
        "completion_rate": interval(0.9),
        "success_rate": interval(greedy),
        "turns": {"mean": 2.5, "hist": {"1": 10, "2": 40, "3": 50}},
        "attempts": {"mean": 1.5, "hist": {"1": 50, "2": 50}},
        "recovery_rate": interval(0.4),
        "tool_error_rate": interval(0.1),
    }
    return {
        "family": "arithmetic",
        "problems": 100,
        "rollouts": 500,
        "unit": {
            "greedy": interval(greedy),
            "pass_at_1": interval(greedy * 0.8),
            "pass_at_k": interval(min(1.0, greedy * 1.3)),
            "k": 4,
            "tool_format": interval(0.95) if chain else None,
            "code_pass": None,
        },
        "chain": chain_tier if chain else None,
        "system": {
            "success_rate": interval(greedy * 0.8),
            "infra_failure_rate": interval(infra),
            "invalid_rate": interval(0.01),
            "latency_s": {"p50": 0.5, "p95": 1.5, "p99": 2.5},
            "cost_per_task": {
                "prompt_tokens": 40.0,
                "completion_tokens": tokens,
                "generator_s": 0.2,
                "sandbox_s": 0.0,
                "validator_s": 0.01,
            },
            "cost_total": {"prompt_tokens": 20000.0},
        },
        "validators": {"exact": greedy, "format": format_score},
        "completion_tokens_mean": tokens,
    }


def tier_report(version: int | None, domains: dict[str, dict[str, Any]]) -> dict[str, Any]:
    greedy = [d["unit"]["greedy"]["value"] for d in domains.values()]
    macro = {"greedy": sum(greedy) / len(greedy), "pass_at_1": None, "success_rate": 0.5}
    return {
        "schema": 1,
        "policy": "start" if version is None else f"v{version}",
        "version": version,
        "samples": 4,
        "domains": domains,
        "families": {},
        "overall": {
            "domains": len(domains),
            "macro": macro,
            "micro": {},
            "worst": [{"domain": n, "pass_at_1": 0.1} for n in domains],
        },
    }


#: Samples per versions behind, by ``step % 3``: each matches its ``staleness_mean``.
_STALENESS_COUNTS = ({"0": 256}, {"1": 256}, {"1": 128, "3": 128})


def _metrics_line(step: int, counts: bool = True) -> dict[str, Any]:
    progress = step / STEPS
    rewards = {HEALTHY: 0.2 + 0.3 * progress, HACKED: 0.1 + 0.6 * progress}
    line = {
        "step": step,
        "version": step,
        "samples": 256,
        "trained": 200,
        "reward_mean": sum(rewards.values()) / 2,
        "reward_by_domain": rewards,
        "staleness_mean": float(step % 3),
        "dropped_stale": step % 2,
        "completion_len": 12.0,
        "loss_tokens": 1500,
        "time_train": 0.8,
        "time_batch": 0.1,
        "at": 1_000_000.0 + 1.5 * step,
    }
    if counts:
        line["staleness_counts"] = _STALENESS_COUNTS[step % 3]
    return line


def _heldout_lines() -> list[dict[str, Any]]:
    lines = []
    for version, elapsed in ((0, 0.0), (15, 22.0), (STEPS, 45.0)):
        progress = version / STEPS
        accuracy = {HEALTHY: 0.3 + 0.2 * progress, HACKED: 0.6 - 0.35 * progress}
        for domain, value in accuracy.items():
            lines.append(
                {
                    "domain": domain,
                    "version": version,
                    "versions_seen": 1,
                    "elapsed_s": elapsed,
                    "greedy_accuracy": value,
                    "sampled_accuracy": value * 0.8,
                    "pass_at_4": min(1.0, value * 1.4),
                    "problems": 200,
                    "samples": 4,
                    "failed": 0,
                    "chance": 0.1,
                }
            )
    return lines


_STATS = {
    "generator/g1": {
        "service": "generator",
        "sent_at": 1.0,
        "values": {
            "tokens_per_s": 1200.0,
            "generated_tokens": 90000.0,
            "cache_hit_ratio": 0.85,
            "rollouts_ok": 7000.0,
            "rollouts_infra_failure": 3.0,
            "uptime_s": 75.0,
        },
    },
    "validator/v1": {
        "service": "validator",
        "sent_at": 1.0,
        "values": {"domain.alpha.infra_failure_rate": 0.0, "domain.beta.invalid_rate": 0.02},
    },
    "sandbox/s1": {
        "service": "sandbox",
        "sent_at": 1.0,
        "values": {"executed": 300.0, "uptime_s": 60.0, "failed": 2.0, "sessions": 1.0},
    },
    "feeder/f1": {
        "service": "feeder",
        "sent_at": 1.0,
        "values": {
            "tasks_in_flight": 8.0,
            "domain.alpha.drawn": 120.0,
            "domain.alpha.filtered": 7.0,
            "domain.alpha.pool_easy": 11.0,
            "domain.alpha.pool_normal": 90.0,
            "domain.alpha.pool_hard": 4.0,
            "domain.beta.drawn": 40.0,
        },
    },
}


def write_run(root: Path, *, tiers: bool = True, counts: bool = True) -> Path:
    """A run directory as ``temper train`` leaves it, with a torn last metrics line;
    ``counts`` False leaves out ``staleness_counts``, as older learners did."""
    (root / "learner").mkdir(parents=True)
    (root / "eval").mkdir()
    lines = [json.dumps(_metrics_line(step, counts)) for step in range(1, STEPS + 1)]
    (root / "learner" / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 31, "ver')
    heldout = "".join(json.dumps(line) + "\n" for line in _heldout_lines())
    (root / "eval" / "heldout.jsonl").write_text(heldout)
    (root / "stats.json").write_text(json.dumps(_STATS))
    if tiers:
        (root / "eval" / "tiers").mkdir()
        start = {
            HEALTHY: domain_tiers(greedy=0.3, chain=True),
            HACKED: domain_tiers(greedy=0.6, format_score=0.4),
        }
        end = {
            HEALTHY: domain_tiers(greedy=0.5, chain=True),
            HACKED: domain_tiers(greedy=0.25, infra=0.1, tokens=45.0, format_score=0.98),
        }
        for version, domains in ((0, start), (STEPS, end)):
            path = root / "eval" / "tiers" / f"v{version}.json"
            path.write_text(json.dumps(tier_report(version, domains)))
    return root


# ---------------------------------------------------------------- reading the HTML


class Page(HTMLParser):
    """Tags, section ids with their h2 headings, and image sources of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.images: list[str] = []
        self.sections: dict[str, str] = {}
        self._section: str | None = None
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        found = dict(attrs)
        if tag == "section":
            self._section = found.get("id") or ""
            self.sections[self._section] = ""
        elif tag == "h2":
            self._in_h2 = True
        elif tag == "img":
            self.images.append(found.get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False
        elif tag == "section":
            self._section = None

    def handle_data(self, data: str) -> None:
        if self._in_h2 and self._section is not None:
            self.sections[self._section] += data


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def check_png(source: str) -> None:
    prefix = "data:image/png;base64,"
    assert source.startswith(prefix)
    data = base64.b64decode(source.removeprefix(prefix), validate=True)
    assert data.startswith(PNG_SIGNATURE)
    length, kind = struct.unpack(">I4s", data[8:16])
    width, height = struct.unpack(">II", data[16:24])
    assert (length, kind) == (13, b"IHDR") and width > 100 and height > 100
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert pixels.shape[:2] == (height, width)


def without_images(text: str) -> str:
    page = parse(text)
    for source in page.images:
        text = text.replace(source, "")
    return text


def report_html(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", str(run)]) == 0
    out = run / "report.html"
    assert capsys.readouterr().out.strip() == str(out)
    return out.read_text()


# ---------------------------------------------------------------- tests


def test_html_report_is_self_contained_with_every_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = report_html(write_run(tmp_path / "run"), capsys)
    page = parse(text)
    assert set(SECTION_IDS) <= set(page.sections)
    assert all(page.sections[i].strip() for i in SECTION_IDS), "every section has an h2"
    # reward, held-out, tier trends, staleness, throughput, infra failures
    assert len(page.images) == 6
    for source in page.images:
        check_png(source)
    rest = without_images(text)
    assert 'src="http' not in text
    for external in ("http://", "https://", "<script", "<link", "url("):
        assert external not in rest
    assert "script" not in page.tags


def test_html_report_shows_the_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = report_html(write_run(tmp_path / "run"), capsys)
    assert "85.0%" in text  # the generator's prefix-cache hit rate
    assert "<td>sandbox/s1</td><td>300</td><td>5</td>" in text  # 300 execs over 60 s
    assert "v0" in text and f"v{STEPS}" in text
    watch = text[text.index('<section id="watch">') :]
    assert f"{HACKED}: reward_vs_heldout" in watch
    assert f"{HEALTHY}: reward_vs_heldout" not in watch
    assert f"{HACKED}: format_drift" in watch


def test_markdown_has_every_heading_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "run")
    assert main(["report", str(run), "--markdown"]) == 0
    text = capsys.readouterr().out
    for title in (
        "Summary",
        "Train reward",
        "Held-out accuracy",
        "Staleness",
        "Throughput",
        "Sandbox and failures",
        "Tiers: start vs end",
        "Reward-hacking watch",
    ):
        assert f"\n## {title}\n" in text
    assert "data:image" not in text and "<img" not in text
    assert "| alpha |" in text
    assert not (run / "report.html").exists()


def test_report_without_tiers_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "run", tiers=False)
    page = parse(text := report_html(run, capsys))
    assert set(SECTION_IDS) <= set(page.sections)
    tiers = text[text.index('<section id="tiers">') :]
    assert "eval/tiers/ is absent" in tiers and "eval/tiers/v&lt;version&gt;.json" in tiers
    assert len(page.images) == 4
    assert main(["report", str(run), "--markdown"]) == 0
    assert "eval/tiers/ is absent" in capsys.readouterr().out


def test_report_with_metrics_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", tiers=False)
    (run / "stats.json").unlink()
    (run / "eval" / "heldout.jsonl").unlink()
    page = parse(report_html(run, capsys))
    assert set(SECTION_IDS) <= set(page.sections)
    for source in page.images:
        check_png(source)


def test_out_writes_where_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run")
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.is_file() and not (run / "report.html").exists()


def test_missing_run_dir_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no run directory" in capsys.readouterr().err


def test_run_dir_without_metrics_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run").mkdir()
    assert main(["report", str(tmp_path / "run")]) == 2
    assert "no learner steps" in capsys.readouterr().err


def test_torn_lines_and_bad_tier_reports_are_skipped(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    (run / "eval" / "tiers" / "v99.json").write_text('{"schema": 1, "domains": {"x": {}}}')
    (run / "eval" / "tiers" / "v100.json").write_text('{"schema": 1, "dom')
    data = load(run)
    assert len(data.steps) == STEPS
    assert [r.version for r in data.tiers] == [0, STEPS]
    assert "learner/metrics.jsonl:31" in data.skipped
    assert {"eval/tiers/v99.json", "eval/tiers/v100.json"} <= set(data.skipped)
    assert data.missing == ()
    assert data.domains() == (HEALTHY, HACKED)


def _markdown_section(run: Path, title: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", str(run), "--markdown"]) == 0
    text = capsys.readouterr().out
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_staleness_is_a_histogram_over_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "run")
    assert load(run).steps[1].staleness_counts == {1: 128, 3: 128}
    section = _markdown_section(run, "Staleness", capsys)
    # 10 steps of each of the three counts: 2,560 + 3,840 + 1,280 samples.
    assert "| versions behind | samples | share |" in section
    assert "| 0 | 2,560 | 33.3% |" in section
    assert "| 1 | 3,840 | 50.0% |" in section
    assert "| 3 | 1,280 | 16.7% |" in section
    assert "| 2 |" not in section
    assert "Missing" not in section


def test_staleness_without_counts_falls_back_to_step_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "run", counts=False)
    assert all(not step.staleness_counts for step in load(run).steps)
    section = _markdown_section(run, "Staleness", capsys)
    assert "> Missing: learner/metrics.jsonl has no staleness_counts" in section
    assert "versions behind | samples" not in section
    page = parse(report_html(run, capsys))
    assert len(page.images) == 6
    for source in page.images:
        check_png(source)


def test_bad_staleness_counts_keep_the_step_and_the_good_entries(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    bad = {"x": 3, "2": "many", "1": 5, "-1": 2, "3": True, "4": 1.5, "²": 7, " 5 ": 2}
    lines = [
        {**_metrics_line(1), "staleness_counts": bad},
        {**_metrics_line(2), "staleness_counts": [1, 2]},
    ]
    (run / "learner" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    first, second = load(run).steps
    assert first.staleness_counts == {1: 5, 5: 2}
    assert second.staleness_counts == {}


def test_heldout_change_headers_name_each_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section = _markdown_section(write_run(tmp_path / "run"), "Summary", capsys)
    assert (
        "| domain | start version | start greedy | end version | end greedy | change "
        "| start pass@k | end pass@k | chance |" in section
    )
    # Greedy 30% -> 50%, pass@4 at 1.4x greedy: where RL has room, named per domain.
    row = next(line for line in section.splitlines() if line.startswith(f"| {HEALTHY} "))
    assert "| 42.0% (k=4) | 70.0% (k=4) |" in row


def test_feeder_section_shows_each_domains_draw_filtering_and_pools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section = _markdown_section(
        write_run(tmp_path / "run"), "Feeder: draw, filtering and pools", capsys
    )
    assert "| alpha | 120 | 0 | 7 | 0 | 0 | 11 | 90 | 4 |" in section
    assert "| beta | 40 |" in section
    run = write_run(tmp_path / "bare")
    (run / "stats.json").write_text("{}")
    assert "no feeder service ran" in _markdown_section(
        run, "Feeder: draw, filtering and pools", capsys
    )
