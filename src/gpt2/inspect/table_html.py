"""A table as one self-contained HTML page (no script, no network): a row label, then cells of text shaded
blue (positive) or red (negative) by a value in [-1, 1]. Patching tables and an SAE's top features per token
are drawn with it."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

from gpt2.runtime.files import atomic_write_text

Cell = tuple[str, float]
"""(text, shade): shade in [-1, 1], 0 white, 1 full blue, -1 full red."""

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:center;white-space:pre}"
    "th{background:#f4f4f4}caption{font-weight:bold;margin-bottom:.5em}"
)


def table_html(title: str, columns: Sequence[str], rows: Sequence[tuple[str, Sequence[Cell]]], note: str = "") -> str:
    """The page: a header of `columns` (the first heads the row labels), one <tr> per (label, cells)."""
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    body = []
    for label, cells in rows:
        tds = "".join(f'<td style="background:{_shade(shade)}">{html.escape(text)}</td>' for text, shade in cells)
        body.append(f"<tr><th>{html.escape(label)}</th>{tds}</tr>")
    note_html = f"<p>{html.escape(note)}</p>" if note else ""
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><table><caption>{html.escape(title)}</caption>"
        f"<tr>{head}</tr>{''.join(body)}</table>{note_html}</body></html>\n"
    )


def save_table_html(
    path: str | os.PathLike[str],
    title: str,
    columns: Sequence[str],
    rows: Sequence[tuple[str, Sequence[Cell]]],
    note: str = "",
) -> Path:
    """Write `table_html(...)` to `path` (atomically) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, table_html(title, columns, rows, note))
    return path


def _shade(value: float) -> str:
    strength = max(0.0, min(1.0, abs(value)))
    fade = round(255 * (1.0 - 0.75 * strength))
    return f"rgb({fade},{fade},255)" if value >= 0 else f"rgb(255,{fade},{fade})"
