"""Attention patterns as one self-contained, interactive HTML page: no CDN, no network, opens from disk.

The page embeds the patterns (lower triangle only, as attention is causal; 4 decimals) as JSON and draws them
with a few lines of plain JavaScript on a <canvas>:
- a layer and a head chooser, and a thumbnail of every head of the layer (click one to choose it);
- the chosen head's heatmap (queries down, keys across) with the tokens as labels; hovering a cell names the
  query, the key and the weight;
- the prompt as text: hovering (or clicking, to pin) a token shades every earlier token by the attention
  that token pays it in the chosen head.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from gpt2.runtime.files import atomic_write_text

DECIMALS = 4


def attention_html(
    patterns: torch.Tensor,
    labels: Sequence[str],
    *,
    layers: Sequence[int],
    heads: Sequence[int],
    title: str = "Attention patterns",
) -> str:
    """The page for patterns (len(layers), len(heads), T, T) with token `labels` (T of them)."""
    n_layers, n_heads, T, _ = patterns.shape
    if len(labels) != T or (n_layers, n_heads) != (len(layers), len(heads)):
        raise ValueError(f"patterns {tuple(patterns.shape)} do not match {len(labels)} labels, {layers}, {heads}")
    rounded = patterns.detach().float().cpu().round(decimals=DECIMALS).tolist()
    # rows[i] keeps keys 0..i: what a causal query can see (halves the page)
    triangles = [[[row[: i + 1] for i, row in enumerate(pattern)] for pattern in layer] for layer in rounded]
    data = {"tokens": list(labels), "layers": list(layers), "heads": list(heads), "patterns": triangles}
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")  # never closes the <script>
    before, after = PAGE.split("__DATA__")  # substituted apart, so no token or title is read as a marker
    title = html.escape(title)
    return before.replace("__TITLE__", title) + payload + after.replace("__TITLE__", title)


def save_attention_html(
    patterns: torch.Tensor,
    labels: Sequence[str],
    path: str | os.PathLike[str],
    *,
    layers: Sequence[int],
    heads: Sequence[int],
    title: str = "Attention patterns",
) -> Path:
    """Write `attention_html(...)` to `path` (atomically) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, attention_html(patterns, labels, layers=layers, heads=heads, title=title))
    return path


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 8px; }
  .controls { margin: 8px 0; display: flex; gap: 16px; align-items: center; }
  .thumbs { display: flex; flex-wrap: wrap; gap: 6px; margin: 8px 0; }
  .thumb { text-align: center; font-size: 11px; cursor: pointer; padding: 2px; border: 2px solid transparent; }
  .thumb.chosen { border-color: #e6550d; }
  .main { display: flex; gap: 24px; align-items: flex-start; flex-wrap: wrap; }
  #info { min-height: 1.4em; font-family: ui-monospace, monospace; margin: 6px 0; }
  .side { flex: 1 1 320px; max-width: 640px; min-width: 0; }
  .text { line-height: 1.9; }
  .tok { padding: 1px 0; border-radius: 3px; white-space: pre-wrap; cursor: pointer; }
  .tok.query { outline: 2px solid #e6550d; }
  .hint { color: #777; font-size: 12px; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
<div class="controls">
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
  <span class="hint">click a thumbnail to choose a head; hover the heatmap or the text</span>
</div>
<div class="thumbs" id="thumbs"></div>
<div id="info"></div>
<div class="main">
  <canvas id="heatmap"></canvas>
  <div class="side"><div class="hint">attention paid by the hovered (click: pinned) token to earlier tokens</div>
  <div class="text" id="text"></div></div>
</div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const T = data.tokens.length;
const state = { layer: 0, head: 0, query: T - 1, pinned: false };
const layerSelect = document.getElementById("layer"), headSelect = document.getElementById("head");
const info = document.getElementById("info");
const shown = (s) => s.replace(/\\n/g, "\\u21b5").replace(/\\t/g, "\\u21e5");

function weight(layer, head, q, k) { return k <= q ? data.patterns[layer][head][q][k] : 0; }
const BLUES = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
function color(w) {  // matplotlib's "Blues", as in the PNG: white at 0, dark blue at 1
  const x = Math.max(0, Math.min(1, w)) * (BLUES.length - 1);
  const i = Math.min(BLUES.length - 2, Math.floor(x)), t = x - i;
  const [a, b] = [BLUES[i], BLUES[i + 1]];
  return `rgb(${[0, 1, 2].map((c) => Math.round(a[c] + (b[c] - a[c]) * t)).join(",")})`;
}
function drawPattern(canvas, layer, head, cell, margin, labels) {
  const ratio = window.devicePixelRatio || 1;
  const size = margin + cell * T;
  canvas.width = size * ratio; canvas.height = size * ratio;
  canvas.style.width = size + "px"; canvas.style.height = size + "px";
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.fillStyle = "white"; ctx.fillRect(0, 0, size, size);
  for (let q = 0; q < T; q++) for (let k = 0; k < T; k++) {
    ctx.fillStyle = k <= q ? color(weight(layer, head, q, k)) : "#f0f0f0";
    ctx.fillRect(margin + k * cell, margin + q * cell, cell, cell);
  }
  if (!labels) return;
  ctx.fillStyle = "#222"; ctx.font = `${Math.min(12, cell)}px ui-monospace, monospace`;
  ctx.textBaseline = "middle";
  for (let i = 0; i < T; i++) {
    const text = shown(data.tokens[i]).slice(0, 14);
    ctx.textAlign = "right"; ctx.fillText(text, margin - 4, margin + (i + 0.5) * cell);  // queries
    ctx.save(); ctx.translate(margin + (i + 0.5) * cell, margin - 4); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left"; ctx.fillText(text, 0, 0); ctx.restore();  // keys
  }
}
const heatmap = document.getElementById("heatmap");
const cell = Math.max(4, Math.min(28, Math.floor(560 / T)));
const margin = cell >= 8 ? 110 : 0;

function render() {
  drawPattern(heatmap, state.layer, state.head, cell, margin, margin > 0);
  const thumbs = document.getElementById("thumbs");
  thumbs.innerHTML = "";
  const thumbCell = Math.max(1, Math.floor(64 / T));
  data.heads.forEach((headNumber, h) => {
    const box = document.createElement("div");
    box.className = "thumb" + (h === state.head ? " chosen" : "");
    const canvas = document.createElement("canvas");
    drawPattern(canvas, state.layer, h, thumbCell, 0, false);
    box.appendChild(canvas);
    box.appendChild(document.createElement("br"));
    box.appendChild(document.createTextNode("head " + headNumber));
    box.onclick = () => { state.head = h; headSelect.value = h; render(); };
    thumbs.appendChild(box);
  });
  renderText();
}
function renderText() {
  const text = document.getElementById("text");
  text.innerHTML = "";
  data.tokens.forEach((token, i) => {
    const span = document.createElement("span");
    span.className = "tok" + (i === state.query ? " query" : "");
    span.textContent = shown(token);
    const w = weight(state.layer, state.head, state.query, i);
    span.style.background = i <= state.query ? color(w) : "transparent";
    span.style.color = w > 0.5 ? "white" : "#222";
    span.title = `${w.toFixed(3)}`;
    span.onmouseenter = () => { if (!state.pinned) { state.query = i; renderText(); } };
    span.onclick = () => { state.pinned = !(state.pinned && state.query === i); state.query = i; renderText(); };
    text.appendChild(span);
  });
}
heatmap.addEventListener("mousemove", (event) => {
  const box = heatmap.getBoundingClientRect();
  const k = Math.floor((event.clientX - box.left - margin) / cell);
  const q = Math.floor((event.clientY - box.top - margin) / cell);
  if (q < 0 || k < 0 || q >= T || k >= T) { info.textContent = ""; return; }
  const w = weight(state.layer, state.head, q, k);
  info.textContent = `layer ${data.layers[state.layer]} head ${data.heads[state.head]}: query ${q} ` +
    `${JSON.stringify(data.tokens[q])} -> key ${k} ${JSON.stringify(data.tokens[k])}: ` +
    (k <= q ? w.toFixed(4) : "masked (future)");
});
data.layers.forEach((n, i) => layerSelect.add(new Option(n, i)));
data.heads.forEach((n, i) => headSelect.add(new Option(n, i)));
layerSelect.onchange = () => { state.layer = +layerSelect.value; render(); };
headSelect.onchange = () => { state.head = +headSelect.value; render(); };
render();
</script>
</body>
</html>
"""
