"""PNG pictures with matplotlib: attention patterns as heatmaps, and the logit lens as a table of top tokens.

Drawn on a bare `matplotlib.figure.Figure` (the Agg canvas): no pyplot, no global backend switched, no window.
Inputs are plain tensors and token labels; gpt2.inspect.pictures turns a model and a prompt into them.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gpt2.runtime.files import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
MAX_LABELED_PANELS = 16  # beyond this many heatmaps, only the outer panels carry token labels
MAX_TICK_LABELS = 48  # label every token up to this many positions, then every k-th
MASKED_COLOR = "#e4e4e4"  # attention to a later position (masked, not merely zero)
CELL_TEXT_CHARS = 8  # a logit-lens cell shows at most this many characters of its token


def save_attention_png(
    patterns: torch.Tensor,
    labels: Sequence[str],
    path: str | os.PathLike[str],
    *,
    layers: Sequence[int],
    heads: Sequence[int],
    title: str = "",
) -> Path:
    """Heatmaps of attention patterns (len(layers), len(heads), T, T) with the tokens as labels: queries
    down the side, keys along the bottom. One layer: the heads wrap four to a row; several: a layer per row."""
    import matplotlib
    import numpy
    from matplotlib.figure import Figure

    n_layers, n_heads, T, _ = patterns.shape
    if len(labels) != T or (n_layers, n_heads) != (len(layers), len(heads)):
        raise ValueError(f"patterns {tuple(patterns.shape)} do not match {len(labels)} labels, {layers}, {heads}")
    panels = [(r, c) for r in range(n_layers) for c in range(n_heads)]
    ncols = min(n_heads, 4) if n_layers == 1 else n_heads
    nrows = math.ceil(len(panels) / ncols)
    label_all = len(panels) <= MAX_LABELED_PANELS
    panel_inches = min(max(0.16 * T + 1.2, 2.2), 7.0) if label_all else min(max(0.05 * T + 1.0, 1.4), 3.0)
    figure = Figure(figsize=(ncols * panel_inches + 1.2, nrows * panel_inches + 0.8), dpi=DPI, layout="constrained")
    if title:
        figure.suptitle(title)
    axes = figure.subplots(nrows, ncols, squeeze=False)
    ticks, tick_labels = _ticks([_plain(label) for label in labels])
    future = torch.ones(T, T, dtype=torch.bool).triu(1).numpy()  # keys a query cannot see: drawn grey
    causal = numpy.ma.masked_array(patterns.float().cpu().numpy(), mask=numpy.broadcast_to(future, patterns.shape))
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad=MASKED_COLOR)
    image = None
    for slot, ax in enumerate(axes.flat):
        if slot >= len(panels):
            ax.set_axis_off()
            continue
        r, c = panels[slot]
        image = ax.imshow(causal[r, c], cmap=cmap, vmin=0.0, vmax=1.0)
        ax.set_title(f"layer {layers[r]} head {heads[c]}", fontsize=9)
        row, col = divmod(slot, ncols)
        show_y = label_all or col == 0
        show_x = label_all or row == nrows - 1
        ax.set_yticks(ticks, tick_labels if show_y else [], fontsize=7)
        ax.set_xticks(ticks, tick_labels if show_x else [], fontsize=7, rotation=90)
        if show_y and col == 0:
            ax.set_ylabel("query")
        if show_x and row == nrows - 1:
            ax.set_xlabel("key")
    assert image is not None  # at least one panel
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight")
    return _save(figure, path)


def save_logit_lens_png(
    probabilities: torch.Tensor,
    token_labels: Sequence[Sequence[str]],
    input_labels: Sequence[str],
    path: str | os.PathLike[str],
    *,
    row_names: Sequence[str],
    next_labels: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """The logit lens as a table: a row per residual (the embeddings at the bottom), a column per position.
    Each cell names the top token and is shaded by its probability.

    probabilities: (rows, P); token_labels[r][p]: the top token's text; input_labels: the P input tokens
    (bottom axis); next_labels: the tokens that actually come next (top axis), when known.
    """
    from matplotlib.figure import Figure

    rows, P = probabilities.shape
    if len(row_names) != rows or len(input_labels) != P or len(token_labels) != rows:
        raise ValueError(f"probabilities {(rows, P)} do not match {len(row_names)} rows and {len(input_labels)} inputs")
    figure = Figure(figsize=(0.85 * P + 2.4, 0.36 * rows + 1.8), dpi=DPI, layout="constrained")
    if title:
        figure.suptitle(title)
    ax = figure.subplots()
    image = ax.imshow(probabilities.float().cpu().numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.invert_yaxis()  # the forward pass reads upwards: embeddings at the bottom, the output on top
    for r in range(rows):
        for p in range(P):
            text = _plain(token_labels[r][p])
            text = text if len(text) <= CELL_TEXT_CHARS else text[: CELL_TEXT_CHARS - 1] + "…"
            dark = float(probabilities[r, p]) > 0.5
            ax.text(p, r, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_yticks(range(rows), list(row_names), fontsize=8)
    ax.set_xticks(range(P), [_plain(label) for label in input_labels], fontsize=8, rotation=90)
    ax.set_xlabel("input token")
    if next_labels is not None:
        top = ax.secondary_xaxis("top")
        top.set_xticks(range(P), [_plain(label) for label in next_labels], fontsize=8, rotation=90)
        top.set_xlabel("actual next token")
    figure.colorbar(image, ax=ax, shrink=0.8, label="probability of the top token")
    return _save(figure, path)


def _ticks(labels: list[str]) -> tuple[list[int], list[str]]:
    step = max(1, math.ceil(len(labels) / MAX_TICK_LABELS))
    positions = list(range(0, len(labels), step))
    return positions, [labels[p] for p in positions]


def _plain(label: str) -> str:
    """A label matplotlib prints as written: '$' would start mathtext."""
    return label.replace("$", r"\$")


def _save(figure: Figure, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())
    return path


def save_patching_png(
    values: torch.Tensor,
    column_labels: Sequence[str],
    path: str | os.PathLike[str],
    *,
    column_name: str,
    title: str = "",
    colorbar_label: str = "logit difference",
) -> Path:
    """A patching table (n_layer, columns) as a heatmap, layer 0 at the top, on a colour scale centred on 0
    (blue: the patch moved the metric up, red: down)."""
    from matplotlib.figure import Figure

    n_layer, columns = values.shape
    if len(column_labels) != columns:
        raise ValueError(f"values {tuple(values.shape)} do not match {len(column_labels)} column labels")
    figure = Figure(figsize=(0.42 * columns + 2.6, 0.32 * n_layer + 1.9), dpi=DPI, layout="constrained")
    if title:
        figure.suptitle(title)
    ax = figure.subplots()
    limit = max(float(values.abs().max()), 1e-6)
    image = ax.imshow(values.float().cpu().numpy(), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_yticks(range(n_layer), [str(layer) for layer in range(n_layer)], fontsize=8)
    ax.set_ylabel("layer")
    ticks, tick_labels = _ticks([_plain(label) for label in column_labels])
    ax.set_xticks(ticks, tick_labels, fontsize=8, rotation=90)
    ax.set_xlabel(column_name)
    figure.colorbar(image, ax=ax, shrink=0.8, label=colorbar_label)
    return _save(figure, path)
