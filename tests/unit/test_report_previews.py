"""Pictures of rendered parts, from scored rollouts to ``report.json`` to the HTML and
markdown reports of ``temper report`` and ``temper eval``."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from protocol.messages import Rollout, ScoredRollout, ScoreStatus, ValidatorDetail
from services.cli import main
from services.domains.cad import domain
from services.evaluation.report.eval_page import write_pages
from services.evaluation.tiers import Outcome, build_report
from services.validator.cad_preview import render_preview
from tests.unit import cad_meshes
from tests.unit.test_report import STEPS, check_png, parse, write_run

CAD = "cad-box"
#: Rewards of the drawn rollouts: the report keeps the best (1.0) and the worst (0.25).
REWARDS = (0.5, 1.0, 0.25)


def scored(index: int, reward: float, png: bytes | None) -> ScoredRollout:
    task = domain(CAD, {"shape": "box"}).examples(1, "eval")[0].task
    rollout = Rollout(id=f"r/{index}", task=task, sample_index=0, completion_text="cube(1);")
    detail = ValidatorDetail(
        name="cad", score=reward, message=f"check summary {index}", preview=png
    )
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward, details=[detail])


def outcome(index: int, reward: float, png: bytes | None) -> Outcome:
    return Outcome.of(
        scored(index, reward, png),
        family="cad_parts",
        problem=f"{CAD}-{index}",
        greedy=True,
        pass_threshold=1.0,
        multi_turn=False,
    )


@pytest.fixture(scope="module")
def pictures() -> list[bytes]:
    """A different real render per drawn rollout: boxes of different heights."""
    return [render_preview(cad_meshes.open_box(40, 30, 10 + 5 * i, 2)) for i in range(3)]


@pytest.fixture(scope="module")
def report(pictures: list[bytes]) -> dict[str, Any]:
    drawn = [outcome(i, reward, pictures[i]) for i, reward in enumerate(REWARDS)]
    plain = outcome(9, 0.0, None)  # no preview: never picked
    return build_report([*drawn, plain], k=0, policy="v7", version=7)


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def test_the_report_keeps_the_best_and_the_worst_preview_of_a_domain(
    report: dict[str, Any], pictures: list[bytes]
) -> None:
    kept = report["domains"][CAD]["previews"]
    assert [(p["problem"], p["reward"]) for p in kept] == [(f"{CAD}-1", 1.0), (f"{CAD}-2", 0.25)]
    assert base64.b64decode(kept[0]["png"]) == pictures[1]
    assert kept[1]["note"] == "check summary 2" and kept[1]["status"] == "scored"
    json.dumps(report)  # report.json stays plain JSON


def test_a_domain_without_pictures_has_no_previews() -> None:
    plain = build_report([outcome(0, 1.0, None)], k=0, policy="p", version=None)
    assert "previews" not in plain["domains"][CAD]


@pytest.fixture
def run(tmp_path: Path, report: dict[str, Any]) -> Path:
    """A run whose last evaluation drew parts (``temper train``'s eval/tiers/v<N>.json)."""
    run = write_run(tmp_path / "run")
    last = run / "eval" / "tiers" / f"v{STEPS}.json"
    tiers = json.loads(last.read_text())
    tiers["domains"][CAD] = report["domains"][CAD]
    last.write_text(json.dumps(tiers))
    return run


def test_the_run_report_embeds_the_previews_with_their_captions(
    run: Path, pictures: list[bytes]
) -> None:
    assert main(["report", str(run)]) == 0
    text = (run / "report.html").read_text()
    tiers = text[text.index('<section id="tiers">') :]
    for png in (pictures[1], pictures[2]):
        assert data_uri(png) in tiers
    assert data_uri(pictures[0]) not in text  # neither the best nor the worst
    for source in parse(tiers).images:
        check_png(source)
    assert f"{CAD}: {CAD}-2 (greedy, scored) reward 0.25: check summary 2" in tiers


def linked(markdown: str, base: Path) -> list[Path]:
    """The files a markdown text shows as images, resolved against ``base``."""
    return [base / link for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)]


def test_the_markdown_run_report_links_preview_files_beside_it(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], pictures: list[bytes]
) -> None:
    out = tmp_path / "notes" / "run.md"
    out.parent.mkdir()
    assert main(["report", str(run), "--markdown", "--out", str(out)]) == 0
    files = linked(out.read_text(), out.parent)
    assert [f.read_bytes() for f in files] == [pictures[1], pictures[2]]
    assert all(f.parent == out.parent / "run-figures" for f in files)
    capsys.readouterr()
    # To stdout: the files go into the run directory, linked by the path given.
    assert main(["report", str(run), "--markdown"]) == 0
    files = linked(capsys.readouterr().out, Path.cwd())
    assert [f.read_bytes() for f in files] == [pictures[1], pictures[2]]
    assert all(f.parent == run / "report-figures" for f in files)


def test_temper_eval_pages_show_the_previews(
    tmp_path: Path, report: dict[str, Any], pictures: list[bytes]
) -> None:
    page, notes = write_pages(report, tmp_path)
    html = page.read_text()
    assert data_uri(pictures[1]) in html and data_uri(pictures[2]) in html
    assert "Rendered parts" in html and "<td>pass@1</td>" in html
    files = linked(notes.read_text(), tmp_path)
    assert [f.read_bytes() for f in files] == [pictures[1], pictures[2]]


def test_a_report_without_previews_has_no_parts_section(tmp_path: Path) -> None:
    plain = build_report([outcome(0, 1.0, None)], k=0, policy="p", version=None)
    page, notes = write_pages(plain, tmp_path)
    assert "Rendered parts" not in page.read_text()
    assert "![" not in notes.read_text() and not (tmp_path / "report-figures").exists()


def test_a_broken_preview_is_left_out_and_the_report_still_reads(
    tmp_path: Path, report: dict[str, Any], pictures: list[bytes]
) -> None:
    broken = json.loads(json.dumps(report))
    broken["domains"][CAD]["previews"][0]["png"] = "not base64!"
    html = write_pages(broken, tmp_path)[0].read_text()
    assert data_uri(pictures[2]) in html and ScoreStatus.SCORED.value in html
