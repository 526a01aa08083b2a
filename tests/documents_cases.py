"""Reference and planted answers for the documents family, shared by its unit and
integration tests: each planted answer breaks one constraint of the ``doc_file`` check."""

from __future__ import annotations

from dataclasses import dataclass

from services.domains.documents.family import DocumentSpec, build, reference_answer
from services.domains.documents.layout import table_pages
from services.domains.formats import ANSWER_TAG, CITE_TAG
from services.validator.numbers import parse_number

#: Two cells, one each side of the product-line table's page break.
LONG_PDF = DocumentSpec("pdf", "long", "combined", 7)
LONG_HTML = DocumentSpec("html", "long", "combined", 7)


@dataclass(frozen=True)
class Planted:
    name: str
    text: str
    #: The check that must fail, and a phrase its reason must hold.
    check: str
    reason: str


def _cites(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"<{CITE_TAG}>")]


def _answer(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"<{ANSWER_TAG}>"))


def _other_cell(spec: DocumentSpec) -> str:
    """A citation of an existing cell, with its true value, that the answer does not use."""
    report, question = build(spec)
    used = {(c.table, c.row) for c in question.cells}
    table = report.table(question.cells[0].table)
    row = next(r for r in table.rows if (table.number, r.label) not in used)
    page = table_pages(report)[(table.number, row.label)]
    return (
        f'<{CITE_TAG}>page {page}, table {table.number}, row "{row.label}", '
        f'column "{table.columns[0]}": {row.cells()[1]}</{CITE_TAG}>'
    )


def planted(spec: DocumentSpec) -> list[Planted]:
    reference = reference_answer(*build(spec))
    cites, answer = _cites(reference), _answer(reference)
    value = parse_number(answer.removeprefix("<answer>").removesuffix("</answer>"))
    assert value is not None
    wrong = f"<{ANSWER_TAG}>{float(value.value) + 1000:.1f}</{ANSWER_TAG}>"
    ghost = 'page 1, table 1, row "Goodwill impairment", column "Q1 2000": 1.0'
    ghost = f"<{CITE_TAG}>{ghost}</{CITE_TAG}>"
    misread = cites[0].replace(": ", ": 9", 1)
    page = int(cites[1].split(",")[0].removeprefix(f"<{CITE_TAG}>page "))
    wrong_page = cites[1].replace(f"page {page},", f"page {page - 1},", 1)
    return [
        Planted("wrong number", "\n".join([*cites, wrong]), "answer", "wrong number"),
        Planted("missing citation", "\n".join([cites[0], answer]), "cells_support", "not cited"),
        Planted("no citation", answer, "cells_exist", "no citation"),
        Planted(
            "nonexistent cell",
            "\n".join([*cites, ghost, answer]),
            "cells_exist",
            "cites a cell that does not exist",
        ),
        Planted(
            "cell on another page",
            "\n".join([cites[0], wrong_page, answer]),
            "cells_exist",
            f"(it is on page {page})",
        ),
        Planted(
            "unsupported cell",
            "\n".join([cites[0], _other_cell(spec), answer]),
            "cells_support",
            "does not support the number",
        ),
        Planted(
            "misread value",
            "\n".join([misread, *cites[1:], answer]),
            "grounded",
            "the document has",
        ),
    ]
