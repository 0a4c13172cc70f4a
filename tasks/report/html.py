"""The report document (sections of text, tables and figures) and its two renderings: GitHub
Markdown (figures as links to PNG files next to it) and ONE self-contained HTML file (inline
CSS, figures embedded as base64 ``data:`` URIs, no external requests).

The HTML carries a small inline script that records script and resource errors and, once the
page has loaded, counts the tables and the figures that decoded (``naturalWidth > 0``) and
the tables wider than the page (they would scroll horizontally), and writes the result into
``<div id="render-check" data-status="ok|broken" data-tables=.. data-images=..
data-images-loaded=.. data-errors=.. data-wide-tables=.. data-wide=<names> data-viewport=..>``,
so a headless browser (or a reader) can see that everything rendered.
"""

from __future__ import annotations

import base64
import html
import math
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import quote

import polars as pl


@dataclass
class Table:
    """A table block: ``frame`` shown in full (callers cap long tables and say so in
    ``note``). ``wrap``: long text cells wrap (examples with questions and answers) instead
    of widening the table; ``links``: column → URL prefix, each value of the column becomes a
    link to ``prefix + the URL-quoted value`` (e.g. a trial key to the viewer)."""

    title: str
    frame: pl.DataFrame
    note: str = ""
    float_precision: int = 3
    wrap: bool = False
    links: dict[str, str] = field(default_factory=dict)


@dataclass
class Figure:
    """A figure block: PNG bytes saved as ``plots/<name>.png`` beside the Markdown."""

    title: str
    name: str
    png: bytes
    caption: str = ""


@dataclass
class Section:
    """A titled section: paragraphs of ``text`` (blank-line separated; `code` spans allowed)
    followed by its blocks."""

    title: str
    text: str = ""
    blocks: list[Table | Figure] = field(default_factory=list)


def markdown_table(
    df: pl.DataFrame, float_precision: int = 3, links: dict[str, str] | None = None
) -> str:
    """A Polars frame as a GitHub Markdown table (all rows and columns, no dtypes); columns in
    ``links`` (column → URL prefix) become Markdown links. Text cells are escaped
    (:func:`md_escape`): a model's answer with ``<script>``, ``<img onerror>`` or
    ``[x](javascript:…)`` shows as text, never as HTML or a link."""
    text_cols = [c for c, dt in zip(df.columns, df.dtypes) if dt == pl.String]
    if text_cols:
        df = df.with_columns(pl.col(c).map_elements(md_escape, return_dtype=pl.String)
                             for c in text_cols)
    for col, prefix in (links or {}).items():
        if col in df.columns:
            df = df.with_columns(
                pl.col(col).map_elements(
                    lambda v, p=prefix: f"[{v}]({p}{quote(_md_unescape(str(v)), safe='')})",
                    return_dtype=pl.String,
                )
            )
    if any(dt == pl.String for dt in df.dtypes):
        df = df.with_columns(pl.col(pl.String).str.replace_all("|", "\\|", literal=True)
                             .str.replace_all("\n", " ", literal=True))
    with POLARS_CONFIG_LOCK, pl.Config(
        tbl_formatting="MARKDOWN",
        tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True,
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=30_000,
        fmt_str_lengths=200,
        fmt_table_cell_list_len=20,
        float_precision=float_precision,
    ):
        return str(df)


#: held around every ``pl.Config`` block: Polars keeps its formatting options in environment
#: variables, and two threads setting and reading them at once race in libc's environment
#: (a CI run segfaulted inside ``DataFrame.__str__`` while rendering a report)
POLARS_CONFIG_LOCK = threading.Lock()

_MD_SPECIAL = re.compile(r"([\\`\[\]])")


def md_escape(text: str) -> str:
    """``text`` as literal Markdown table-cell text: ``&``, ``<`` and ``>`` as HTML entities
    (no raw HTML), backslash, backtick and brackets backslash-escaped (no code spans, links or
    images)."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def _md_unescape(text: str) -> str:
    """The original of an :func:`md_escape` d text (for a link target)."""
    return html.unescape(re.sub(r"\\([\\`\[\]])", r"\1", text))


def render_markdown(title: str, intro: str, sections: list[Section]) -> str:
    """The document as GitHub Markdown; figures link ``plots/<name>.png``."""
    out = [f"# {title}", intro.strip()]
    for sec in sections:
        out.append(f"## {sec.title}")
        if sec.text.strip():
            out.append(sec.text.strip())
        for block in sec.blocks:
            if isinstance(block, Table):
                out.append(f"### {block.title}")
                if block.note:
                    out.append(block.note)
                if block.frame.height == 0:
                    out.append("(no rows)")
                else:
                    out.append(markdown_table(block.frame, block.float_precision, block.links))
            else:
                out.append(f"### {block.title}")
                out.append(f"![{block.title}](plots/{block.name}.png)")
                if block.caption:
                    out.append(f"*{block.caption}*")
    return "\n\n".join(p for p in out if p) + "\n"


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    return _BOLD.sub(r"<strong>\1</strong>", _CODE.sub(r"<code>\1</code>", html.escape(text)))


def _paragraphs(text: str) -> str:
    paras = [p.strip() for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    out = []
    for p in paras:
        lines = p.splitlines()
        if all(line.lstrip().startswith(("- ", "* ")) for line in lines):
            items = "".join(f"<li>{_inline(line.lstrip()[2:])}</li>" for line in lines)
            out.append(f"<ul>{items}</ul>")
        else:
            out.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(out)


def _cell(value, dtype: pl.DataType, precision: int) -> tuple[str, str]:
    if value is None:
        return "–", "null"
    if isinstance(value, float):
        return (f"{value:.{precision}f}" if not math.isnan(value) else "NaN"), "num"
    if isinstance(value, bool):
        return ("true" if value else "false"), ""
    if isinstance(value, int):
        return str(value), "num"
    if isinstance(value, list):
        return html.escape(", ".join(str(v) for v in value)), ""
    return html.escape(str(value)), ""


def _header(name: str) -> str:
    """A column name that may break after ``_`` (so headers wrap instead of widening)."""
    return "_<wbr>".join(html.escape(part) for part in name.split("_"))


def html_table(
    df: pl.DataFrame, name: str, float_precision: int = 3, wrap: bool = False,
    links: dict[str, str] | None = None,
) -> str:
    """``df`` as an HTML ``<table class="data">`` (values escaped, numbers right-aligned,
    nulls shown as –; ``wrap``: text cells wrap; ``links``: column → URL prefix)."""
    head = "".join(f"<th>{_header(c)}</th>" for c in df.columns)
    dtypes = df.dtypes
    linked = [(links or {}).get(c) for c in df.columns]
    body = []
    for row in df.iter_rows():  # report tables are capped to a few hundred rows
        cells = []
        for value, dtype, prefix in zip(row, dtypes, linked):
            text, cls = _cell(value, dtype, float_precision)
            if prefix is not None and value is not None:
                href = html.escape(prefix + quote(str(value), safe=""), quote=True)
                text = f'<a href="{href}">{text}</a>'
            cls = cls or ("txt" if dtype == pl.String else "")
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    classes = "data wrap" if wrap else "data"
    return (
        f'<table class="{classes}" data-name="{html.escape(name)}" data-rows="{df.height}">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1200px;padding:0 1rem;color:#222;line-height:1.45}
h1{font-size:1.6rem}h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
h3{font-size:1.05rem;margin-top:1.4rem}
code{background:#f3f3f3;padding:0 .25rem;border-radius:3px;font-size:.92em}
.scroll{overflow-x:auto;margin:.5rem 0}
table.data{border-collapse:collapse;font-size:.85rem}
table.data th,table.data td{border:1px solid #ddd;padding:.2rem .5rem;white-space:nowrap}
table.data th{background:#f6f8fa;position:sticky;top:0;white-space:normal;vertical-align:bottom}
table.data td.txt{white-space:normal;overflow-wrap:anywhere;max-width:22rem}
table.data.wrap td{white-space:normal;overflow-wrap:anywhere;max-width:24rem;vertical-align:top}
table.data td.num{text-align:right;font-variant-numeric:tabular-nums}
table.data td.null{color:#aaa;text-align:center}
table.data tbody tr:nth-child(even){background:#fafafa}
figure{margin:1rem 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85rem;color:#555}.note{font-size:.85rem;color:#555}
nav ul{columns:2;font-size:.9rem}#render-check{font-size:.8rem;color:#777;margin-top:3rem}
"""

_EARLY_SCRIPT = """
window.__reportErrors = [];
window.addEventListener("error", function (e) {
  window.__reportErrors.push(e.message || ("failed to load " + (e.target && e.target.tagName)));
}, true);
"""

_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.querySelectorAll("img.plot"));
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  var tables = document.querySelectorAll("table.data").length;
  var wide = Array.prototype.slice.call(document.querySelectorAll("div.scroll")).filter(
    function (d) { return d.scrollWidth > d.clientWidth + 1; }).map(function (d) {
      var t = d.querySelector("table"); return t ? t.getAttribute("data-name") : "?"; });
  var el = document.getElementById("render-check");
  el.setAttribute("data-viewport", String(window.innerWidth));
  el.setAttribute("data-wide-tables", String(wide.length));
  el.setAttribute("data-wide", wide.join(" "));
  el.setAttribute("data-images", String(imgs.length));
  el.setAttribute("data-images-loaded", String(ok));
  el.setAttribute("data-tables", String(tables));
  el.setAttribute("data-errors", String(window.__reportErrors.length));
  el.setAttribute("data-status",
    ok === imgs.length && window.__reportErrors.length === 0 ? "ok" : "broken");
  el.textContent = ok + " of " + imgs.length + " figures rendered; " + tables + " tables" +
    (window.__reportErrors.length ? "; errors: " + window.__reportErrors.join("; ") : ".");
});
"""


def slug(text: str, fallback: str = "section") -> str:
    """``text`` as an id: lower-cased, each run of characters other than ``a-z`` / ``0-9``
    replaced by one ``-``, none leading or trailing; ``fallback`` when nothing is left. The
    report's section anchors and table ids and the Prefect artifact keys of its tables
    (:func:`tasks.report.stage.publish_prefect_artifacts`) all use it, so a table's artifact
    key carries its HTML id."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or fallback


def render_html(title: str, intro: str, sections: list[Section]) -> str:
    """The document as one self-contained HTML page (figures embedded as base64 PNG)."""
    nav = "".join(
        f'<li><a href="#{slug(s.title)}">{html.escape(s.title)}</a></li>' for s in sections
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>",
        f"<script>{_EARLY_SCRIPT}</script></head><body>",
        f"<h1>{_inline(title)}</h1>",
        _paragraphs(intro),
        f"<nav><ul>{nav}</ul></nav>",
    ]
    for sec in sections:
        parts.append(f'<section id="{slug(sec.title)}"><h2>{html.escape(sec.title)}</h2>')
        if sec.text.strip():
            parts.append(_paragraphs(sec.text))
        for block in sec.blocks:
            parts.append(f"<h3>{html.escape(block.title)}</h3>")
            if isinstance(block, Table):
                if block.note:
                    parts.append(f'<p class="note">{_inline(block.note)}</p>')
                parts.append(
                    '<div class="scroll">'
                    + html_table(block.frame, slug(block.title), block.float_precision,
                                 block.wrap, block.links)
                    + "</div>"
                )
            else:
                data = base64.b64encode(block.png).decode("ascii")
                parts.append(
                    f'<figure><img class="plot" data-name="{html.escape(block.name)}" '
                    f'alt="{html.escape(block.title)}" src="data:image/png;base64,{data}">'
                    + (
                        f"<figcaption>{_inline(block.caption)}</figcaption>"
                        if block.caption
                        else ""
                    )
                    + "</figure>"
                )
        parts.append("</section>")
    parts += [
        '<div id="render-check" data-status="pending">figures not checked (scripts disabled)</div>',
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
