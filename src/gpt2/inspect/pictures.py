"""From a model and a prompt to a picture file: what `gpt2 inspect attention` and `gpt2 inspect logit-lens` call.

The output format follows the file name: `.png` (matplotlib, gpt2.inspect.plots) or, for attention, `.html`
(one self-contained interactive page, gpt2.inspect.attention_html). The model runs in eval mode (no dropout)
for the picture and is left in the mode it came in.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from gpt2.inspect.attention_html import save_attention_html
from gpt2.inspect.hooks import run_with_cache
from gpt2.inspect.lens import logit_lens
from gpt2.inspect.patching import activation_patching, logit_diff
from gpt2.inspect.plots import save_attention_png, save_logit_lens_png, save_patching_png
from gpt2.inspect.sae import SparseAutoencoder, sae_losses, top_features
from gpt2.inspect.table_html import save_table_html
from gpt2.model import GPT
from gpt2.runtime.files import atomic_write_text
from gpt2.tokenizer.protocol import TextTokenizer

ATTENTION_FORMATS = (".png", ".html", ".htm")
LENS_FORMATS = (".png",)
PATCHING_FORMATS = (".json", ".png", ".html", ".htm")
SAE_FORMATS = (".json", ".html", ".htm")
TOP_FEATURES = 5  # features listed per token
MAX_LENS_POSITIONS = 48  # a longer prompt's logit lens shows its last this many positions (a readable width)


def attention_picture(
    model: GPT,
    tokenizer: TextTokenizer,
    prompt: str,
    out: str | os.PathLike[str],
    *,
    layer: int | None = None,
    head: int | None = None,
) -> Path:
    """Attention heatmaps of `prompt`, one per head, with the tokens as labels, written to `out` (.png or
    .html). layer / head: only that one (default every layer / every head)."""
    path = _output(out, ATTENTION_FORMATS)
    ids = _encode(model, tokenizer, prompt)
    n_layer, n_head = model.config.n_layer, model.config.n_head
    layers = _choose(layer, n_layer, "--layer", "layers")
    heads = _choose(head, n_head, "--head", "heads")
    names = [f"blocks.{i}.attn.hook_pattern" for i in layers]
    with torch.no_grad(), _eval_mode(model):
        _, cache = run_with_cache(model, ids, names)
    patterns = torch.stack([cache[name][0, heads] for name in names])  # (layers, heads, T, T)
    labels = token_labels(tokenizer, ids[0].tolist())
    title = f"attention: {_short(prompt)}"
    if path.suffix.lower() == ".png":
        return save_attention_png(patterns, labels, path, layers=layers, heads=heads, title=title)
    return save_attention_html(patterns, labels, path, layers=layers, heads=heads, title=title)


def logit_lens_picture(model: GPT, tokenizer: TextTokenizer, prompt: str, out: str | os.PathLike[str]) -> Path:
    """The logit lens of `prompt` as a table written to `out` (.png): the top next token at every layer
    (rows, embeddings at the bottom) and position (columns), shaded by its probability."""
    path = _output(out, LENS_FORMATS)
    ids = _encode(model, tokenizer, prompt)
    T = ids.shape[1]
    positions = list(range(max(0, T - MAX_LENS_POSITIONS), T))
    with _eval_mode(model):
        lens = logit_lens(model, ids, positions=positions)
    probabilities, top_ids = lens.top_tokens(1)  # (rows, 1, P, 1)
    probabilities, top_ids = probabilities[:, 0, :, 0], top_ids[:, 0, :, 0]  # (rows, P)
    top_labels = [token_labels(tokenizer, row.tolist()) for row in top_ids]
    inputs = token_labels(tokenizer, ids[0].tolist())
    next_labels = [inputs[p + 1] if p + 1 < T else "" for p in positions]
    row_names = ["embed"] + [f"block {i}" for i in range(model.config.n_layer)]
    return save_logit_lens_png(
        probabilities,
        top_labels,
        [inputs[p] for p in positions],
        path,
        row_names=row_names,
        next_labels=next_labels,
        title=f"logit lens: {_short(prompt)}",
    )


def patching_picture(
    model: GPT,
    tokenizer: TextTokenizer,
    prompts: tuple[str, str],
    answers: tuple[str, str],
    out: str | os.PathLike[str],
    *,
    site: str = "resid_pre",
) -> Path:
    """Activation patching of prompts = (clean, corrupted) with the metric logit(answer) - logit(wrong) for
    answers = (answer, wrong), each one token, written to `out`: `.json` (site, tokens, `logit_diff`
    [layer][position or head], the clean and corrupted runs' values), `.png` (a heatmap) or `.html` (a table)."""
    path = _output(out, PATCHING_FORMATS)
    clean = _encode(model, tokenizer, prompts[0], what="the clean prompt", option="--clean")
    corrupted = _encode(model, tokenizer, prompts[1], what="the corrupted prompt", option="--corrupt")
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"the clean prompt is {clean.shape[1]} tokens and the corrupted one {corrupted.shape[1]}; "
            "patching needs prompts of the same number of tokens"
        )
    answer, wrong = _one_token(tokenizer, answers[0], "--answer"), _one_token(tokenizer, answers[1], "--wrong")
    if answer == wrong:  # the metric would be 0 at every site: a table of zeros that says nothing
        raise ValueError(
            f"--answer and --wrong are the same token ({answers[0]!r}, id {answer}); patching measures the logit of "
            "one minus the other: pass two different tokens"
        )
    with _eval_mode(model):
        result = activation_patching(model, clean, corrupted, logit_diff(answer, wrong), site)
    labels = token_labels(tokenizer, corrupted[0].tolist())
    columns = [f"head {h}" for h in range(model.config.n_head)] if site == "head" else labels
    title = f"patching {site}: {_short(prompts[1])} <- {_short(prompts[0])}"
    suffix = path.suffix.lower()
    if suffix == ".json":
        atomic_write_text(path, json_text(result.to_dict(labels)))
        return path
    if suffix == ".png":
        return save_patching_png(
            result.values, columns, path, column_name="head" if site == "head" else "position", title=title
        )
    scale = max(float(result.values.abs().max()), 1e-6)
    rows = [
        (f"layer {layer}", [(f"{v:.3f}", v / scale) for v in row.tolist()]) for layer, row in enumerate(result.values)
    ]
    note = f"logit difference: clean run {result.clean:.3f}, corrupted run {result.corrupted:.3f}"
    return save_table_html(path, title, ["", *columns], rows, note)


def sae_features_file(
    model: GPT, tokenizer: TextTokenizer, sae: SparseAutoencoder, prompt: str, out: str | os.PathLike[str]
) -> Path:
    """The SAE's most active features at every token of `prompt`, with its reconstruction MSE and the model's
    loss on the prompt without and with the SAE spliced in, written to `out`: `.json` (hook, tokens, per token
    a list of {"feature", "activation"}, mse, loss, spliced_loss; a value that is NaN or infinite, as an SAE whose
    activations overflow gives, is null) or `.html` (a table, a row per token)."""
    path = _output(out, SAE_FORMATS)
    ids = _encode(model, tokenizer, prompt)
    with _eval_mode(model):
        values, features = top_features(model, ids, sae, TOP_FEATURES)
        losses = sae_losses(model, ids, sae) if ids.shape[1] > 1 else None
    labels = token_labels(tokenizer, ids[0].tolist())
    per_token = [
        [{"feature": int(f), "activation": float(v)} for f, v in zip(row_ids, row_values, strict=True)]
        for row_ids, row_values in zip(features.tolist(), values.tolist(), strict=True)
    ]
    summary = {"mse": losses.mse, "loss": losses.loss, "spliced_loss": losses.spliced_loss} if losses else {}
    if path.suffix.lower() == ".json":
        data = {"hook": sae.hook_name, "tokens": labels, "features": per_token, **summary}
        atomic_write_text(path, json_text(data))
        return path
    scale = max(float(values.max()), 1e-6) if values.numel() else 1.0
    rows = [
        (label, [(f"#{f['feature']} {f['activation']:.2f}", f["activation"] / scale) for f in row])
        for label, row in zip(labels, per_token, strict=True)
    ]
    note = ", ".join(f"{key} {value:.4f}" for key, value in summary.items())
    columns = ["token", *(f"top {i + 1}" for i in range(values.shape[1]))]
    return save_table_html(path, f"SAE features at {sae.hook_name}: {_short(prompt)}", columns, rows, note)


def json_text(data: object) -> str:
    """`data` as indented JSON text, every NaN or infinite float written as null: JSON has no NaN, and a bare
    `NaN` in the file is refused by strict readers (JavaScript's JSON.parse, jq).

    >>> json_text({"mse": float("nan"), "loss": [1.5, float("inf")]})
    '{\\n "mse": null,\\n "loss": [\\n  1.5,\\n  null\\n ]\\n}\\n'
    """
    return json.dumps(_finite_or_null(data), indent=1, allow_nan=False) + "\n"


def _finite_or_null(data: object) -> object:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite_or_null(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_finite_or_null(value) for value in data]
    return data


def _one_token(tokenizer: TextTokenizer, text: str, option: str) -> int:
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        raise ValueError(f"{option} {text!r} is {len(ids)} tokens; pass text that is exactly one token (e.g. ' Paris')")
    return ids[0]


def token_labels(tokenizer: TextTokenizer, ids: Sequence[int]) -> list[str]:
    """Each token's own text, for axis labels, every character visible and one line high: newline and tab as
    \\n and \\t, other control characters and a piece of a multi-byte character as \\xNN.

    >>> from gpt2.tokenizer import load_tokenizer
    >>> token_labels(load_tokenizer("bytes"), list(b"a\\n\\x1a\\xc3"))
    ['a', '\\\\n', '\\\\x1a', '\\\\xc3']
    """
    return [_visible(tokenizer.decode_bytes([token_id]).decode("utf-8", errors="backslashreplace")) for token_id in ids]


def _visible(text: str) -> str:
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return "".join(c if c.isprintable() else named.get(c, f"\\x{ord(c):02x}") for c in text)


def _output(out: str | os.PathLike[str], formats: Sequence[str]) -> Path:
    path = Path(out)
    if path.suffix.lower() not in formats:
        raise ValueError(
            f"cannot tell the picture format from {str(out)!r}: end the file name in {' or '.join(formats)}"
        )
    return path


def _encode(
    model: GPT, tokenizer: TextTokenizer, prompt: str, *, what: str = "the prompt", option: str = "--prompt"
) -> torch.Tensor:
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError(f"{what} is empty; pass {option} TEXT")
    block_size = model.config.block_size
    if len(ids) > block_size:
        raise ValueError(f"the prompt is {len(ids)} tokens, more than the model's context ({block_size}); shorten it")
    device = model.transformer.wte.weight.device
    return torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)


def _choose(value: int | None, count: int, option: str, what: str) -> list[int]:
    if value is None:
        return list(range(count))
    if not 0 <= value < count:
        raise ValueError(f"{option} {value} does not exist: the model has {count} {what}, numbered 0 to {count - 1}")
    return [value]


def _short(prompt: str, limit: int = 60) -> str:
    flat = " ".join(prompt.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
