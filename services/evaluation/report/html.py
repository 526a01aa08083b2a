"""The report as one self-contained HTML page: inline CSS, PNGs as data URIs, no script.

Nothing is fetched when the page opens, so it can be mailed, attached to a CI run or
opened on a machine with no network, and shows the same everywhere.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape

from services.evaluation.report.document import Alert, Block, Figure, Section, Table

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1em 2em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.8em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 13px; }
.alert { background: #fdecea; border-left: 4px solid #c0392b; padding: 0.5em 0.8em;
         margin: 0.5em 0; }
.missing { color: #7a5b00; background: #fff8e1; border-left: 4px solid #e0b000;
           padding: 0.4em 0.8em; margin: 0.4em 0; }
"""


def render(sections: Sequence[Section], title: str) -> str:
    nav = " ".join(f'<a href="#{escape(s.id)}">{escape(s.title)}</a>' for s in sections)
    body = "\n".join(_section(s) for s in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{escape(title)}</h1>\n<nav>{nav}</nav>\n{body}\n</body>\n</html>\n"
    )


def _section(section: Section) -> str:
    parts = [f'<section id="{escape(section.id)}">', f"<h2>{escape(section.title)}</h2>"]
    parts.extend(_block(b) for b in section.blocks)
    parts.extend(f'<p class="missing">Missing: {escape(m)}</p>' for m in section.missing)
    parts.append("</section>")
    return "\n".join(parts)


def _block(block: Block) -> str:
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        return _figure(block)
    if isinstance(block, Alert):
        return f'<p class="alert">{escape(block.text)}</p>'
    return f"<p>{escape(block)}</p>"


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.headers)
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in table.rows
    )
    caption = f"<caption>{escape(table.caption)}</caption>" if table.caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _figure(figure: Figure) -> str:
    data = base64.b64encode(figure.png).decode("ascii")
    alt = escape(figure.caption)
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
        f"<figcaption>{alt}</figcaption></figure>"
    )
