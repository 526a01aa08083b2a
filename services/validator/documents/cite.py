"""Citations as the documents family asks for them, read from a completion.

``page 3, table 2, row "Net income", column "Q3 2025": 4,512.3``: a page, a table
number, a row and a column name in quotes, and the value read there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from services.validator.numbers import Number, parse_number

#: Longer text is not one citation (and is not run through the pattern at all).
MAX_CITATION: Final = 300
_QUOTES: Final = str.maketrans({"\u201c": '"', "\u201d": '"'})
_CITATION: Final = re.compile(
    r'page\s*(\d{1,4})\s*,\s*table\s*(\d{1,3})\s*,\s*row\s*"([^"]{1,120})"\s*,'
    r'\s*column\s*"([^"]{1,60})"\s*(?:[:=]\s*(.{0,60}))?',
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Citation:
    page: int
    table: int
    row: str
    column: str
    #: The value the citation says the cell holds; None when it states none.
    value: Number | None
    stated: str

    def where(self) -> str:
        return f'page {self.page}, table {self.table}, row "{self.row}", column "{self.column}"'


def parse_citation(text: str) -> Citation | None:
    """The citation ``text`` holds, or None if it is not of the asked-for form."""
    if len(text) > MAX_CITATION:
        return None
    found = _CITATION.fullmatch(text.translate(_QUOTES).strip())
    if found is None:
        return None
    page, table, row, column, stated = found.groups()
    stated = (stated or "").strip()
    value = parse_number(stated) if stated else None
    return Citation(int(page), int(table), row.strip(), column.strip(), value, stated)
