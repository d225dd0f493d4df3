"""report.html: the table and the figures in one file (images embedded as data: URIs, styles
inline), so that a sweep can be shared as one file and opened without network access."""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

from mmm_orch.reporting.table import Row, cell, shown_columns

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f0f0f0; }
td.text { text-align: left; }
figure { margin: 1.5em 0; }
img { max-width: 100%; border: 1px solid #eee; }
p.note { color: #555; font-size: 0.9em; max-width: 60em; }
"""


def page(
    title: str, table: list[Row], figures: list[Path], definitions: str, hint: str = ""
) -> str:
    columns = shown_columns(table)
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"text" if k in ("point", "mesh", "state") else "num"}">'
            f"{html.escape(cell(r, k))}</td>"
            for k, _ in columns
        )
        + "</tr>\n"
        for r in table
    )
    images = "".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.name)}'
        f"</figcaption></figure>\n"
        for p in figures
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<p class="note">Made by mmm-orch report on {time.strftime("%Y-%m-%d %H:%M")}.</p>\n'
        f'<table id="points"><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>\n'
        f'<p class="note">{html.escape(definitions)}</p>\n'
        + (f'<p class="note">{html.escape(hint)}</p>\n' if hint else "")
        + images
        + "</body></html>\n"
    )
