"""The documents family: reports drawn from a seed, rendered as PDF and HTML, read back,
and answers scored by the ``doc_file`` check, each planted mistake for its own reason."""

from __future__ import annotations

import asyncio
import re
from fractions import Fraction
from pathlib import Path

import pytest

from protocol.messages import ChatMessage, Rollout, Task
from services.domains.documents import family
from services.domains.documents.family import DocumentSpec, build, domain, reference_answer
from services.domains.documents.layout import pages, report_text, table_pages
from services.domains.documents.questions import KINDS, answer_text, compute
from services.domains.documents.render import render
from services.validator.base import InfraFailure, InvalidRollout
from services.validator.documents.judge import DocumentCache, DocumentFileQA
from services.validator.documents.parse import ParsedDocument, parse
from tests.documents_cases import LONG_HTML, LONG_PDF, planted

#: One cache for the module: a PDF takes about half a second to parse.
CACHE = DocumentCache(size=64)
VALIDATOR = DocumentFileQA(cache=CACHE)


def rollout(spec: DocumentSpec, text: str) -> Rollout:
    task = Task(
        id="doc-1",
        domain="docs",
        prompt=[ChatMessage(role="user", content="q")],
        metadata={"document": spec.as_metadata()},
    )
    return Rollout(id="doc-1/0", task=task, sample_index=0, completion_text=text)


def parsed(spec: DocumentSpec) -> ParsedDocument:
    return CACHE.load(spec)


def test_generation_is_deterministic() -> None:
    first = family.problem(LONG_PDF)
    family.build.cache_clear()
    family.problem.cache_clear()
    again = family.problem(LONG_PDF)
    assert first == again
    for spec in (LONG_PDF, LONG_HTML):
        assert render(build(spec)[0], spec.fmt) == render(build(spec)[0], spec.fmt)
    other = family.problem(DocumentSpec("pdf", "long", "combined", 8))
    assert other.question != first.question
    tasks = domain("d", {"format": "html"}).make_tasks(3, "eval", seed=4)
    assert tasks == domain("d", {"format": "html"}).make_tasks(3, "eval", seed=4)


@pytest.mark.parametrize("seed", range(12))
def test_a_long_report_continues_a_table_across_a_page_break(seed: int) -> None:
    report, question = build(DocumentSpec("html", "long", "combined", seed))
    assert len(pages(report)) >= 3 and len(report.tables()) == 5
    on = table_pages(report)
    products = report.tables()[3]
    assert len({on[(products.number, row.label)] for row in products.rows}) == 2
    assert f"Table {products.number}: Revenue by product line (USD thousands) (continued)" in (
        report_text(report)
    )
    # The combined question takes one row from each side of the break.
    assert len({on[(c.table, c.row)] for c in question.cells}) == 2


def test_the_prompt_is_the_text_with_page_markers_and_no_answer() -> None:
    problem = family.problem(LONG_PDF)
    markers = re.findall(r"^--- page (\d+) ---$", problem.question, re.MULTILINE)
    assert markers == [str(p.number) for p in pages(build(LONG_PDF)[0])]
    assert problem.metadata == {
        "answer": problem.metadata["answer"],
        "document": {"format": "pdf", "length": "long", "question": "combined", "seed": 7},
    }
    assert "<cite>" not in problem.question


@pytest.mark.parametrize("spec", [LONG_PDF, LONG_HTML], ids=["pdf", "html"])
def test_the_file_parses_back_to_the_same_table_values(spec: DocumentSpec) -> None:
    report = build(spec)[0]
    document, on = parsed(spec), table_pages(report)
    cells = 0
    for table in report.tables():
        for row in table.rows:
            part = document.tables[(on[(table.number, row.label)], table.number)]
            for column, printed in zip(table.columns, row.cells()[1:], strict=True):
                assert part.cell(row.label, column) == printed, (table.number, row.label, column)
                cells += 1
    assert cells == sum(len(t.rows) * len(t.columns) for t in report.tables())
    assert len(document.tables) == len(report.tables()) + 1  # one table over two pages


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("length", ["short", "long"])
async def test_the_reference_answer_scores_1_html(kind: str, length: str) -> None:
    spec = DocumentSpec("html", "short" if length == "short" else "long", kind, 3)
    verdict = await VALIDATOR.score(rollout(spec, reference_answer(*build(spec))))
    assert verdict.score == pytest.approx(1.0), verdict.message


@pytest.mark.parametrize("spec", [LONG_PDF, DocumentSpec("pdf", "short", "share", 2)])
async def test_the_reference_answer_scores_1_pdf(spec: DocumentSpec) -> None:
    verdict = await VALIDATOR.score(rollout(spec, reference_answer(*build(spec))))
    assert verdict.score == pytest.approx(1.0), verdict.message
    assert "answer 1.00: matches" in verdict.message


@pytest.mark.parametrize("spec", [LONG_PDF, LONG_HTML], ids=["pdf", "html"])
async def test_each_planted_mistake_scores_less_for_its_own_reason(spec: DocumentSpec) -> None:
    for case in planted(spec):
        verdict = await VALIDATOR.score(rollout(spec, case.text))
        assert verdict.score < 1.0, case.name
        named = next(p for p in verdict.message.split("; ") if p.startswith(case.check))
        assert not named.startswith(f"{case.check} 1.00"), (case.name, verdict.message)
        assert case.reason in verdict.message, (case.name, verdict.message)


async def test_the_scores_of_planted_mistakes() -> None:
    scores = {
        c.name: (await VALIDATOR.score(rollout(LONG_HTML, c.text))).score
        for c in planted(LONG_HTML)
    }
    # A right answer earns 0.6, and its citations up to 0.4 more by their quality: needed
    # cells cited with their right value over every cell cited or needed.
    assert scores == pytest.approx(
        {
            "wrong number": 0.1,  # the cells found, the computation wrong: at most 0.1
            "missing citation": 0.6 + 0.4 / 2,
            "no citation": 0.6,
            "nonexistent cell": 0.6 + 0.4 * 2 / 3,
            "cell on another page": 0.6 + 0.4 / 3,  # it names no cell there
            "unsupported cell": 0.6 + 0.4 / 3,
            "misread value": 0.6 + 0.4 / 2,
        }
    )


async def test_a_task_without_a_document_spec_is_invalid() -> None:
    bad = rollout(LONG_HTML, "<answer>1</answer>")
    bad.task.metadata["document"] = {"format": "docx", "seed": 1}
    with pytest.raises(InvalidRollout, match="not a document spec"):
        await VALIDATOR.score(bad)


def test_a_cache_folder_keeps_the_rendered_file(tmp_path: Path) -> None:
    cache = DocumentCache(directory=tmp_path)
    first = cache.load(LONG_HTML)
    (written,) = tmp_path.iterdir()
    assert written.read_bytes() == render(build(LONG_HTML)[0], "html")
    assert parse(written.read_bytes(), "html") == first == cache.load(LONG_HTML)


def test_the_reference_computations_by_hand() -> None:
    values = [Fraction(200), Fraction(250)]
    assert compute("sum", values) == 450
    assert compute("difference", values) == 50
    assert compute("growth", values) == 25
    assert compute("share", values) == 80
    assert answer_text("growth", Fraction(1, 3)) == "0.33%"
    assert answer_text("sum", Fraction(-12345, 10)) == "-1,234.5"


async def test_concurrent_rollouts_of_one_document_share_one_parse() -> None:
    cache = DocumentCache()
    loads: list[DocumentSpec] = []
    original = cache.load

    def counted(spec: DocumentSpec) -> ParsedDocument:
        loads.append(spec)
        return original(spec)

    cache.load = counted  # type: ignore[method-assign]
    validator = DocumentFileQA(cache=cache)
    text = reference_answer(*build(LONG_HTML))
    verdicts = await asyncio.gather(*(validator.score(rollout(LONG_HTML, text)) for _ in range(8)))
    assert [v.score for v in verdicts] == [pytest.approx(1.0)] * 8
    assert loads == [LONG_HTML]


async def test_a_file_that_does_not_parse_is_an_infra_failure(tmp_path: Path) -> None:
    cache = DocumentCache(directory=tmp_path)
    (tmp_path / "long-combined-7.pdf").write_bytes(b"%PDF-1.4 truncated")
    validator = DocumentFileQA(cache=cache)
    with pytest.raises(InfraFailure, match="unreadable"):
        await validator.score(rollout(LONG_PDF, "<answer>1</answer>"))
    with pytest.raises(InfraFailure, match="unreadable"):  # tried again, not remembered
        await validator.score(rollout(LONG_PDF, "<answer>1</answer>"))
