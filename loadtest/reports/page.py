"""The shape every report shares: the answer first, the evidence one click below.

A `Page` is what a person reads in ten seconds (a lead line where the run is incomplete, one large
verdict line per batch size, rate or drafter, the picture that answers the question beside them,
a one-paragraph setup and short labelled badges that link to their detail) followed by the
evidence in sections that open on click (plain `<details>`). `markdown` writes it as report.md
(the same order, the sections as headings) and `html` as a self-contained page.
"""

from __future__ import annotations

import html as html_lib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import markdown as markdown_lib

from loadtest.reports.markdown import table as markdown_table

TONES = ("good", "bad", "even", "none")
"""A verdict's colour: speculation pays / does not / breaks even / no verdict (not measured)."""

METHOD_DOC = Path(__file__).resolve().parents[2] / "docs" / "load-tests.md"
"""Where the method behind every table is written down (formulas, agreement, the content check)."""


@dataclass
class Line:
    """One verdict: `level` ("batch 32", "4 req/s", a drafter), `verdict` in a few words, `figures`
    (speedup with its interval, acceptance, content) and the `tone` that colours it."""

    level: str
    verdict: str
    figures: str = ""
    tone: str = "none"

    def __post_init__(self) -> None:
        if self.tone not in TONES:
            raise ValueError(f"tone {self.tone!r}: one of {', '.join(TONES)}")


@dataclass
class Badge:
    """A warning in a few words, labelled (`FLAG`, `CONTENT`, `DRIFT`, ...), linking to the
    section (`target`, a `Section.id`) that holds its detail."""

    label: str
    text: str
    target: str


@dataclass
class Section:
    """Evidence: a title, Markdown (tables, images, a link to the method) and an anchor id."""

    id: str
    title: str
    body: str


@dataclass
class Page:
    title: str
    lines: list[Line]
    setup: str
    """One paragraph, Markdown: model, drafter, K, workload, temperature, machine, repeats."""
    picture: str | None = None
    """File name of the plot that answers the question (a PNG beside the report)."""
    picture_alt: str = ""
    lead: str = ""
    """What the run is when it is not a complete measurement ("interrupted after ..."); empty otherwise."""
    notes: list[str] = field(default_factory=list)
    """Short lines under the verdicts that are findings, not warnings (service targets, a crossover)."""
    badges: list[Badge] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    compact_from: int | None = None
    """Lines from this index on are set one to a row in smaller type (a capacity search visits
    a dozen rates; they must still fit the first screen beside the picture). Default: all lines
    when there are more than `COMPACT_OVER`, else none."""


COMPACT_OVER = 6


def method_link(anchor: str, out: Path | None = None, doc: Path = METHOD_DOC) -> str:
    """A Markdown link to docs/<doc>#anchor, relative to the report folder `out` (so it works from
    a checkout), with the file's name in the text for a report read elsewhere."""
    target = doc.as_posix()
    if out is not None:
        try:
            target = Path(os.path.relpath(doc, out.resolve())).as_posix()
        except ValueError:
            pass
    return f"[docs/{doc.name}#{anchor}]({target}#{anchor})"


def how(anchor: str, out: Path | None) -> str:
    """The sentence that links a section to its method in docs/load-tests.md (`method_link`)."""
    return f" Method: {method_link(anchor, out)}."


def table(rows: tuple[list[str], list[list[str]]]) -> str:
    """A section's table (header, rows) below its text; `(nothing measured)` without rows."""
    return "\n\n" + markdown_table(*rows) if rows[1] else "\n\n(nothing measured)"


# ---------------------------------------------------------------------------------- Markdown
def markdown(page: Page, sources: Mapping[str, str] | None = None) -> str:
    """report.md: the first screen's content in its order, then each section under a heading."""
    sources = sources or {}
    out = [f"# {page.title}", ""]
    if page.lead:
        out += [f"**{page.lead}**", ""]
    out += [f"- **{line.level}: {line.verdict}**" + (f" — {line.figures}" if line.figures else "")
            for line in page.lines]
    if page.notes:
        out += [""] + [f"- {n}" for n in page.notes]
    if page.picture:
        out += ["", f"![{page.picture_alt or page.picture}]({sources.get(page.picture, page.picture)})"]
    out += ["", page.setup]
    if page.badges:
        out += ["", *[f"- **{b.label}** [{b.text}](#{b.target})" for b in page.badges]]
    for s in page.sections:
        out += ["", f'<a id="{s.id}"></a>', "", f"## {s.title}", "", s.body.rstrip()]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------- HTML
STYLE = """
body{font-family:system-ui,sans-serif;margin:0 auto;padding:12px 24px;max-width:1360px;color:#222}
h1{font-size:20px;margin:4px 0 10px;font-weight:600;color:#444}
.lead{font-size:20px;font-weight:700;background:#fff3cd;border-left:6px solid #d39e00;padding:8px 12px;margin:0 0 12px}
.top{display:flex;gap:24px;align-items:flex-start}
.verdicts{flex:1 1 0;min-width:0}
.answer{flex:0 0 auto;width:600px;margin:0}
.answer img{width:600px;display:block;border:1px solid #ddd}
.line{margin:0 0 12px;line-height:1.2}
.line .v{font-size:26px;font-weight:700}
.line .lv{color:#555;font-weight:600}
.line .f{font-size:17px;color:#333;margin-top:2px}
.compact{margin:0 0 3px;line-height:1.25}.compact .v{font-size:16px;display:inline}
.compact .f{font-size:14px;display:inline;margin-left:8px;color:#444}
.good .v b{color:#187a2f}.bad .v b{color:#b3261e}.even .v b{color:#8a6d00}.none .v b{color:#666}
.notes{font-size:15px;color:#333;margin:4px 0 8px;padding-left:18px}
.badges{margin:6px 0 10px}
.badge{display:inline-block;font-size:13px;margin:0 6px 6px 0;padding:3px 8px;border-radius:12px;background:#fdecea;
 color:#222;text-decoration:none;border:1px solid #e0a8a2}
.badge b{color:#b3261e;margin-right:4px}
.setup{font-size:14px;color:#444;line-height:1.45;margin:8px 0 14px}
details{border-top:1px solid #ddd;padding:6px 0}
summary{cursor:pointer;font-size:17px;font-weight:600;padding:4px 0}
table{border-collapse:collapse;font-size:13px;margin:0.6em 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}
img{max-width:100%}pre{white-space:pre-wrap}
"""


def render_markdown(text: str) -> str:
    """Markdown to HTML (tables, fenced code as <pre>). The text is data (names, error messages),
    never markup: raw HTML in it is shown as text, not passed through."""
    converter = markdown_lib.Markdown(extensions=["tables", "fenced_code"])
    converter.preprocessors.deregister("html_block")
    converter.inlinePatterns.deregister("html")
    return converter.convert(text)


def _inline(text: str) -> str:
    """One line of Markdown as inline HTML (no surrounding paragraph)."""
    return re.sub(r"^<p>(.*)</p>$", r"\1", render_markdown(text).strip(), flags=re.S)


def html(page: Page, sources: Mapping[str, str] | None = None) -> str:
    """A self-contained page: `sources` maps a picture's file name to what its <img> loads (a data URI)."""
    sources = sources or {}
    e = html_lib.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(page.title)}</title>"
             f"<style>{STYLE}</style></head><body>", f"<h1>{e(page.title)}</h1>"]
    if page.lead:
        parts.append(f"<p class='lead' data-lead>{e(page.lead)}</p>")
    parts.append("<div class='top'><div class='verdicts'>")
    compact = page.compact_from
    if compact is None:
        compact = 0 if len(page.lines) > COMPACT_OVER else len(page.lines)
    for n, line in enumerate(page.lines):
        size = "compact" if n >= compact else "line"
        parts.append(f"<div class='{size} {line.tone}' data-verdict><div class='v'><span class='lv'>{e(line.level)}:</span> "
                     f"<b>{e(line.verdict)}</b></div>" + (f"<div class='f'>{e(line.figures)}</div>" if line.figures else "")
                     + "</div>")
    if page.notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{_inline(n)}</li>" for n in page.notes) + "</ul>")
    if page.badges:
        parts.append("<div class='badges'>" + "".join(
            f"<a class='badge' href='#{e(b.target)}'><b>{e(b.label)}</b>{e(b.text)}</a>" for b in page.badges) + "</div>")
    parts.append("</div>")
    if page.picture:
        parts.append(f"<figure class='answer'><img data-answer alt='{e(page.picture_alt or page.picture)}' "
                     f"src='{e(sources.get(page.picture, page.picture))}'></figure>")
    parts.append("</div>")
    parts.append(f"<div class='setup'>{render_markdown(page.setup)}</div>")
    for s in page.sections:
        # The anchor sits inside the <details>: a badge's link to it opens the section (browsers
        # expand a closed <details> that holds the fragment's target).
        parts.append(f"<details><summary>{e(s.title)}</summary><div id='{e(s.id)}'>{render_markdown(s.body)}</div>"
                     "</details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
