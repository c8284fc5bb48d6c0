"""The page around the pictures: a heading, sections, the findings as text beside them, and
one stylesheet inline, so the file is the whole report (offline, as a CI artifact)."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       margin: 24px auto; max-width: 1200px; padding: 0 16px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.verdict { font-size: 16px; font-weight: 600; padding: 8px 12px; border-radius: 6px;
           display: inline-block; margin: 8px 0; }
.verdict.bad { background: #fbe9e9; color: #8a1c1c; }
.verdict.good { background: #e8f5e9; color: #1b5e20; }
.verdict.other { background: #fff4e0; color: #7a4b00; }
.finding { border-left: 4px solid #c44e52; background: #fafafa; padding: 8px 12px;
           margin: 8px 0; }
.finding .kind { font-weight: 600; }
.note { color: #666; font-size: 13px; }
.figure { overflow-x: auto; margin: 8px 0; }
.figure svg { max-width: 100%; height: auto; }
.figure.small { display: inline-block; vertical-align: top; margin-right: 16px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
code, pre { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, monospace; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; }
.diff .add { color: #116329; background: #dafbe1; }
.diff .remove { color: #82071e; background: #ffebe9; }
nav a { margin-right: 12px; }
"""


@dataclass(frozen=True)
class Section:
    """One part of a page: a heading, an id to link to, and its HTML."""

    title: str
    anchor: str
    html: str


def paragraph(words: str, cls: str = "") -> str:
    return f'<p class="{cls}">{escape(words)}</p>' if cls else f"<p>{escape(words)}</p>"


def table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def verdict(words: str, tone: str) -> str:
    """``tone``: "good", "bad" or "other"."""
    return f'<div class="verdict {tone}" id="verdict">{escape(words)}</div>'


def finding(kind: str, summary: str, fix: str, extra: str = "") -> str:
    more = f"<br>{escape(extra)}" if extra else ""
    return (f'<div class="finding"><span class="kind">{escape(kind)}</span><br>'
            f'{escape(summary)}<br><b>fix:</b> {escape(fix)}{more}</div>')


def diff(text: str) -> str:
    """A unified diff, each added line marked "add" and each removed one "remove"."""
    rows = []
    for line in text.splitlines():
        kind = "add" if line.startswith("+") and not line.startswith("+++") else \
            "remove" if line.startswith("-") and not line.startswith("---") else ""
        rows.append(f'<span class="{kind}">{escape(line)}</span>' if kind else escape(line))
    return f'<pre class="diff">{chr(10).join(rows)}</pre>'


def page(title: str, subtitle: str, sections: list[Section]) -> str:
    nav = " ".join(f'<a href="#{s.anchor}">{escape(s.title)}</a>' for s in sections)
    parts = "".join(f'<section id="{s.anchor}"><h2>{escape(s.title)}</h2>{s.html}</section>'
                    for s in sections)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"note\">{escape(subtitle)}</p>"
            f"<nav>{nav}</nav>{parts}</body></html>\n")


def write(path: str | Path, html: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path
