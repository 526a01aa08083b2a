"""Cheats on the documents family, through the running validator service: citations that
stand in for an answer, padding, and answers that hedge.  Citations pay only beside an
answer, and only for the cells the question's computation uses, read right."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import Task
from services.domains import load_registry
from services.domains.documents.family import DocumentSpec, build, reference_answer
from services.domains.documents.layout import table_pages
from services.domains.formats import ANSWER_TAG, CITE_TAG
from services.validator import ValidatorService
from tests.integration.support import client
from tests.integration.test_validator_documents import task_for
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)

CONFIG = """
[[domain]]
name = "docs"
kind = "documents"
params = { length = "long", question = "combined", format = "html" }
"""
SPEC = DocumentSpec("html", "long", "combined", 7)
QA = {
    "answer": "25.00%",
    "document": "Line item | Q1 | Q2\nRevenue | 1,000.0 | 1,250.0\nNet income | 100.0 | -20.5",
    "evidence": ["1,000.0", "1,250.0"],
}


def cite(page: int, table: int, row: str, column: str, value: str) -> str:
    where = f'page {page}, table {table}, row "{row}", column "{column}"'
    return f"<{CITE_TAG}>{where}: {value}</{CITE_TAG}>"


def every_cell() -> list[str]:
    """A citation of every cell of every table, each with its printed value."""
    report, _ = build(SPEC)
    pages = table_pages(report)
    return [
        cite(pages[(t.number, r.label)], t.number, r.label, column, printed)
        for t in report.tables()
        for r in t.rows
        for column, printed in zip(t.columns, r.cells()[1:], strict=True)
    ]


def cheats() -> dict[str, tuple[str, float]]:
    """name -> (completion, the most it deserves)."""
    reference = reference_answer(*build(SPEC))
    lines = reference.splitlines()
    cites, answer = lines[:-1], lines[-1]
    value = answer.removeprefix(f"<{ANSWER_TAG}>").removesuffix(f"</{ANSWER_TAG}>")
    numbers = " ".join(f"{n}.5" for n in range(40))
    wrong_valued = [c.replace(": ", ": 1", 1) for c in cites]
    return {
        "reference": (reference, 1.0),
        "citations and no answer": ("\n".join(cites), 0.0),
        "every cell cited and no answer": ("\n".join(every_cell()), 0.0),
        # Padding pays nothing: the needed cells are a handful among hundreds.
        "every cell cited beside the answer": ("\n".join([*every_cell(), answer]), 0.62),
        "wrong-valued citations beside the answer": ("\n".join([*wrong_valued, answer]), 0.6),
        "citations beside an empty answer": (
            "\n".join([*cites, f"<{ANSWER_TAG}></{ANSWER_TAG}>"]),
            0.0,
        ),
        "the answer among many numbers": (
            "\n".join([*cites, f"<{ANSWER_TAG}>{numbers} {value}</{ANSWER_TAG}>"]),
            0.0,
        ),
        "two answers": ("\n".join([*cites, answer, f"<{ANSWER_TAG}>1</{ANSWER_TAG}>"]), 0.1),
        "a hedged answer": (
            "\n".join([*cites, f"<{ANSWER_TAG}>{value} or 0</{ANSWER_TAG}>"]),
            0.0,
        ),
        "citations beside a wrong number": (
            "\n".join([*cites, f"<{ANSWER_TAG}>1</{ANSWER_TAG}>"]),
            0.1,
        ),
        "the question echoed": (build(SPEC)[1].text, 0.0),
    }


async def test_documents_cheats_score_no_more_than_they_deserve(
    nats_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "domains.toml"
    config.write_text(CONFIG)
    registry = load_registry(config, plugins=False)
    task = task_for(registry.get("docs").make_tasks(1, seed=0), SPEC)
    cases = cheats()
    async with ValidatorService(settings(nats_url, domains_config=config)), client(nats_url) as nc:
        js = nc.jetstream()
        for index, (text, _) in enumerate(cases.values()):
            await publish(js, make_rollout(task, text, index=index))
        results = await scored_results(js, len(cases), timeout_s=60)
    got = {s.rollout.sample_index: s for s in results}
    for index, (name, (_, deserved)) in enumerate(cases.items()):
        scored = got[index]
        assert scored.status.value == "scored", (name, scored.error)
        assert 0.0 <= scored.reward <= deserved + 1e-9, (name, scored.reward, scored.details)
    assert got[0].reward == pytest.approx(1.0)


def qa_task() -> Task:
    base = load_registry(None, plugins=False).get("doc_numeric_qa").make_tasks(1, seed=0)[0]
    fields = {f: getattr(base, f) for f in base.__struct_fields__}
    return Task(**{**fields, "metadata": {**base.metadata, **QA}})


async def test_doc_qa_cheats_score_no_more_than_they_deserve(nats_url: str) -> None:
    evidence = "<cite>Revenue | 1,000.0 | 1,250.0</cite>"
    padding = "<cite>Net income | 100.0 | -20.5</cite><cite>Line item | Q1 | Q2</cite>"
    cases = {
        "citations and no answer": (evidence, 0.0),
        "citations beside a wrong answer": (evidence + "<answer>30%</answer>", 0.0),
        "verbatim padding beside the answer": (evidence + padding + "<answer>25%</answer>", 0.74),
        "the answer among other numbers": (evidence + "<answer>25% 30% 1%</answer>", 0.0),
        "right, uncited": ("<answer>25%</answer>", 0.6),
        "right, cited": (evidence + "<answer>25%</answer>", 1.0),
    }
    task = qa_task()
    async with ValidatorService(settings(nats_url)), client(nats_url) as nc:
        js = nc.jetstream()
        for index, (text, _) in enumerate(cases.values()):
            await publish(js, make_rollout(task, text, index=index))
        results = await scored_results(js, len(cases), timeout_s=60)
    got = {s.rollout.sample_index: s.reward for s in results}
    for index, (name, (_, deserved)) in enumerate(cases.items()):
        assert got[index] <= deserved + 1e-9, (name, got[index])
    assert got[5] == pytest.approx(1.0) and got[4] == pytest.approx(0.6)
