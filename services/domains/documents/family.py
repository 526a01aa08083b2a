"""The ``documents`` family: numeric questions over PDF and HTML quarterly reports.

A problem is fixed by its :class:`DocumentSpec` (format, length, question kind, seed):
the report, its file and the question all follow from it, so the validator rebuilds
the file from ``metadata.document`` and never reads the prompt.  The prompt holds the
report's text with page markers, as a user pastes an extracted PDF, and asks for
citations of page, table, row and column.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.domains.api import Domain, Problem, PromptFormat, ValidatorSpec
from services.domains.doc_qa import money
from services.domains.documents.layout import report_text, table_pages
from services.domains.documents.model import LENGTHS, Length, Report, quarter_labels
from services.domains.documents.questions import (
    KINDS,
    MAKERS,
    Question,
    answer_text,
    reference_value,
)
from services.domains.documents.report import build_report
from services.domains.formats import ANSWER_TAG, CITE_TAG
from services.domains.params import Params

FORMATS: Final = ("pdf", "html")
CITE_EXAMPLE: Final = (
    f'<{CITE_TAG}>page 3, table 2, row "Net income", column "Q3 2025": 4,512.3</{CITE_TAG}>'
)
SYSTEM: Final = (
    "Answer the question using only the document. For every table cell you use, write "
    f"one citation naming its page, table, row and column and the value printed there, "
    f"like {CITE_EXAMPLE}. Then give the number in <{ANSWER_TAG}>...</{ANSWER_TAG}>."
)


@dataclass(frozen=True)
class DocumentSpec:
    fmt: str
    length: Length
    kind: str
    seed: int

    def as_metadata(self) -> dict[str, Any]:
        return {"format": self.fmt, "length": self.length, "question": self.kind, "seed": self.seed}

    @classmethod
    def from_metadata(cls, value: Mapping[str, Any]) -> DocumentSpec:
        """The spec of ``metadata.document``; ``ValueError`` naming what is wrong."""
        fmt, length = value.get("format"), value.get("length")
        kind, seed = value.get("question"), value.get("seed")
        if fmt not in FORMATS or length not in LENGTHS or kind not in KINDS:
            raise ValueError(f"not a document spec: {dict(value)!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"document seed {seed!r} is not an integer")
        return cls(fmt, "long" if length == "long" else "short", kind, seed)


@functools.lru_cache(maxsize=512)
def build(spec: DocumentSpec) -> tuple[Report, Question]:
    """The report and question of ``spec`` (cached: a held-out count draws each spec often)."""
    rng = random.Random(f"documents:{spec.length}:{spec.kind}:{spec.seed}")
    quarters = quarter_labels(rng, rng.randint(4, 5))
    report = build_report(rng, spec.length, quarters)
    return report, MAKERS[spec.kind](rng, report)


def reference_answer(report: Report, question: Question) -> str:
    """Citations of exactly the operand cells, with their values, then the answer."""
    pages = table_pages(report)
    cites = []
    for cell in question.cells:
        page = pages[(cell.table, cell.row)]
        printed = money(report.table(cell.table).value(cell.row, cell.column))
        cites.append(
            f'<{CITE_TAG}>page {page}, table {cell.table}, row "{cell.row}", '
            f'column "{cell.column}": {printed}</{CITE_TAG}>'
        )
    answer = answer_text(question.op, reference_value(report, question))
    return "\n".join([*cites, f"<{ANSWER_TAG}>{answer}</{ANSWER_TAG}>"])


@functools.lru_cache(maxsize=512)
def problem(spec: DocumentSpec) -> Problem:
    report, question = build(spec)
    answer = answer_text(question.op, reference_value(report, question))
    noun = "PDF" if spec.fmt == "pdf" else "HTML filing"
    return Problem(
        # No format in the key: the report and question follow from the rest (see
        # ``build``), and the same report as a PDF or as HTML is the same problem.
        key=f"doc:{spec.length}:{spec.kind}:{spec.seed}",
        question=f"Text of the {noun}:\n\n{report_text(report)}\n\nQuestion: {question.text}",
        metadata={"answer": answer, "document": spec.as_metadata()},
        reference=reference_answer(report, question),
    )


@dataclass(frozen=True)
class DocumentSource:
    fmt: str
    length: Length
    kinds: tuple[str, ...]
    #: Distinct problems: a finite space keeps the split (and the build cache) bounded.
    documents: int

    def draw(self, rng: random.Random) -> Problem:
        seed = rng.randrange(self.documents)
        kind = self.kinds[seed % len(self.kinds)]
        return problem(DocumentSpec(self.fmt, self.length, kind, seed))


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    kind = read.choice("question", "any", ("any", *KINDS))
    fmt = read.choice("format", "pdf", FORMATS)
    length = read.choice("length", "short", LENGTHS)
    documents = read.integer("documents", 500, 10, 1_000_000)
    rel_tol = read.number("rel_tol", 0.005, 0.0, 1.0)
    read.done()
    kinds = KINDS if kind == "any" else (kind,)
    return Domain(
        name=name,
        kind="documents",
        source=DocumentSource(fmt, "long" if length == "long" else "short", kinds, documents),
        prompt=PromptFormat(system=SYSTEM),
        validators=(ValidatorSpec(kind="doc_file", params={"rel_tol": rel_tol, "abs_tol": 0.01}),),
        max_tokens=512,
        description=f"{kind} questions over {length} {fmt} quarterly reports",
    )
