"""Perplexity and bits per byte of a token stream, a text or a prepared split, scored with sliding windows.

The windows are the Hugging Face "perplexity of fixed-length models" recipe: every token after the first is
scored exactly once, with up to `context_length` tokens of context; windows advance by `stride` and all have
the same length, so a batch of windows is one (B, T) tensor without padding.

Notation in tensor comments: B = windows in a batch, T = positions per window, C = n_embd, V = vocab_size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpt2.data import TokenView, load_split, read_manifest
from gpt2.eval.common import DEFAULT_BATCH_SIZE, evaluation_mode, model_device, progress_bar
from gpt2.eval.files import read_text
from gpt2.model import GPT, IGNORE_INDEX
from gpt2.tokenizer.protocol import TextTokenizer

COUNT_CHUNK_TOKENS = 1 << 24  # tokens per step when counting bytes: bounded memory on big shards

Tokens = Sequence[int] | np.ndarray | torch.Tensor | TokenView


@dataclass(frozen=True)
class Window:
    """One forward of the sliding-window evaluation.

    Inputs are tokens[start:end], targets tokens[start + 1:end + 1]; only the targets at window positions
    >= `first_scored` count (the earlier ones were scored by a previous window and serve as context here).
    """

    start: int
    end: int
    first_scored: int

    @property
    def num_scored(self) -> int:
        return self.end - self.start - self.first_scored


def sliding_windows(num_tokens: int, context_length: int, stride: int) -> list[Window]:
    """The windows that score each of tokens[1:] exactly once with up to `context_length` tokens of context.

    The first window covers the first `context_length` inputs and scores all its targets; each next one ends
    `stride` tokens later (the last one at the end of the text) and scores only targets no earlier window
    scored, so those see at least `context_length - stride` tokens of context. Every window has the same length,
    min(context_length, num_tokens - 1). stride == context_length: disjoint blocks (fast, least context);
    stride == 1: every token with the full context (one forward per token).

    >>> [(w.start, w.end, w.first_scored) for w in sliding_windows(8, context_length=4, stride=2)]
    [(0, 4, 0), (2, 6, 2), (3, 7, 3)]
    """
    if num_tokens < 2:
        raise ValueError(f"perplexity needs at least 2 tokens (one to predict from, one to score), got {num_tokens}")
    if context_length < 1:
        raise ValueError(f"context_length must be positive, got {context_length}")
    if not 1 <= stride <= context_length:
        raise ValueError(f"stride must be in [1, context_length={context_length}], got {stride}")
    last = num_tokens - 1  # inputs end here at the latest: the last input predicts the last token
    windows: list[Window] = []
    scored_up_to = 0  # targets tokens[1:scored_up_to + 1] are done
    end = min(context_length, last)
    while True:
        start = max(0, end - context_length)
        windows.append(Window(start, end, first_scored=scored_up_to - start))
        scored_up_to = end
        if end == last:
            return windows
        end = min(end + stride, last)


@dataclass(frozen=True)
class PerplexityResult:
    """Mean cross-entropy of the scored tokens and what it means per token and per byte."""

    loss: float
    """Mean negative log-likelihood per scored token, in nats."""
    perplexity: float
    """exp(loss)."""
    bits_per_token: float
    """loss / ln 2."""
    bits_per_byte: float | None
    """Total bits over the UTF-8 bytes the scored tokens stand for; None when num_bytes was not given."""
    num_tokens: int
    """Tokens scored: every token but the first."""
    num_bytes: int | None
    num_windows: int
    context_length: int
    stride: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _as_numpy_tokens(tokens: Tokens) -> np.ndarray | TokenView:
    """A 1-D integer array view of `tokens`. A TokenView over prepared shards is passed through as it is: windows
    are read from it one batch at a time, so a split larger than memory is never loaded whole."""
    if isinstance(tokens, TokenView):
        return tokens
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise ValueError(f"tokens must be one flat sequence of ids, got shape {array.shape}; flatten it first")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"tokens must be integer ids, got dtype {array.dtype}")
    return array


def perplexity(
    model: GPT,
    tokens: Tokens,
    *,
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    num_bytes: int | None = None,
    progress: bool = False,
) -> PerplexityResult:
    """Sliding-window perplexity of one token stream: tokens[1:] each scored once (see `sliding_windows`).

    context_length defaults to the model's block_size, stride to context_length // 2 (each token after the
    first window sees at least half a context). `batch_size` windows go through the model together; the
    result does not depend on it beyond float rounding. Give `num_bytes` (the UTF-8 bytes that tokens[1:]
    stand for, see `count_bytes`) to get bits per byte.

    >>> from gpt2 import GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257))  # block_size 128
    >>> tokens = torch.randint(0, 257, (1000,), generator=torch.Generator().manual_seed(0))
    >>> result = perplexity(model, tokens, stride=64)
    >>> result.num_tokens, 150 < result.perplexity < 400  # untrained: about the vocabulary's 257
    (999, True)
    """
    block_size = model.config.block_size
    context_length = block_size if context_length is None else context_length
    if not 1 <= context_length <= block_size:
        raise ValueError(f"context_length must be in [1, block_size={block_size}], got {context_length}")
    stride = max(1, context_length // 2) if stride is None else stride
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if num_bytes is not None and num_bytes <= 0:
        raise ValueError(f"num_bytes must be positive when given, got {num_bytes}")
    array = _as_numpy_tokens(tokens)
    windows = sliding_windows(len(array), context_length, stride)
    device = model_device(model)

    total_nll = 0.0  # python float (float64): exact enough over hundreds of millions of tokens
    total_scored = 0
    batches = [windows[i : i + batch_size] for i in range(0, len(windows), batch_size)]
    with evaluation_mode(model):
        for batch in progress_bar(batches, enabled=progress, total=len(batches), desc="perplexity"):
            rows = np.stack([array[w.start : w.end + 1] for w in batch]).astype(np.int64)  # (B, T + 1)
            rows_t = torch.from_numpy(rows).to(device)
            idx, targets = rows_t[:, :-1], rows_t[:, 1:].clone()  # (B, T) each
            for row, window in enumerate(batch):
                targets[row, : window.first_scored] = IGNORE_INDEX  # scored by an earlier window
            hidden = model.hidden_states(idx)  # (B, T, C)
            for row, window in enumerate(batch):
                # Logits only where tokens are scored: the LM head over context-only positions is skipped.
                logits = model.lm_head(hidden[row, window.first_scored :])  # (scored, V)
                scored_targets = targets[row, window.first_scored :]
                total_nll += float(F.cross_entropy(logits.float(), scored_targets, reduction="sum"))
            total_scored += int((targets != IGNORE_INDEX).sum())
    assert total_scored == len(array) - 1, "sliding windows must score every token but the first exactly once"

    loss = total_nll / total_scored
    return PerplexityResult(
        loss=loss,
        perplexity=math.exp(loss),
        bits_per_token=loss / math.log(2),
        bits_per_byte=None if num_bytes is None else total_nll / (num_bytes * math.log(2)),
        num_tokens=total_scored,
        num_bytes=num_bytes,
        num_windows=len(windows),
        context_length=context_length,
        stride=stride,
    )


# ---------------------------------------------------------------------------------------- bytes
def token_byte_lengths(tokenizer: TextTokenizer, vocab_size: int) -> np.ndarray:
    """(vocab_size,) UTF-8 byte length of each token id; special tokens (<|endoftext|>) count 0 bytes: they
    separate documents, they are not text."""
    special = set(getattr(tokenizer, "special_tokens", {}).values()) | {tokenizer.eot_token}
    lengths = np.zeros(vocab_size, dtype=np.int64)
    for token_id in range(vocab_size):
        if token_id not in special:
            lengths[token_id] = len(tokenizer.decode_bytes([token_id]))
    return lengths


def count_bytes(tokenizer: TextTokenizer, tokens: Tokens, vocab_size: int | None = None) -> int:
    """UTF-8 bytes of the text `tokens` decode to, special tokens excluded (byte-level BPE is lossless, so
    for tokens = encode(text) this is len(text.encode("utf-8")))."""
    array = _as_numpy_tokens(tokens)
    if array.size == 0:
        return 0
    if vocab_size is None:
        if isinstance(array, TokenView):
            raise ValueError("count_bytes over a TokenView needs vocab_size (the tokenizer's)")
        vocab_size = int(array.max()) + 1
    lengths = token_byte_lengths(tokenizer, vocab_size)
    total = 0
    for first in range(0, len(array), COUNT_CHUNK_TOKENS):  # chunks: a memory-mapped shard is never copied whole
        chunk = np.asarray(array[first : first + COUNT_CHUNK_TOKENS], dtype=np.int64)
        total += int(np.bincount(chunk, minlength=vocab_size) @ lengths)  # occurrences per id x bytes per id
    return total


# ------------------------------------------------------------------------------ texts and prepared splits
def _perplexity_with_bytes(
    model: GPT,
    tokenizer: TextTokenizer,
    tokens: Sequence[int] | np.ndarray | TokenView,
    *,
    max_tokens: int | None,
    context_length: int | None,
    stride: int | None,
    batch_size: int,
    progress: bool,
) -> PerplexityResult:
    """`perplexity` of the first `max_tokens` tokens, with the bytes the scored ones (all but the first) stand for."""
    if max_tokens is not None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2 (one to predict from, one to score), got {max_tokens}")
        tokens = tokens[:max_tokens]
    # the bytes of every scored token (all but the first), counted chunk by chunk over a view
    num_bytes = count_bytes(tokenizer, tokens, tokenizer.vocab_size) - count_bytes(
        tokenizer, tokens[:1], tokenizer.vocab_size
    )
    return perplexity(
        model,
        tokens,
        context_length=context_length,
        stride=stride,
        batch_size=batch_size,
        num_bytes=num_bytes or None,  # 0 bytes (nothing but <|endoftext|>): no bits per byte
        progress=progress,
    )


def perplexity_of_text(
    model: GPT,
    tokenizer: TextTokenizer,
    text: str,
    *,
    eot_prefix: bool = True,
    max_tokens: int | None = None,
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> PerplexityResult:
    """Perplexity and bits per byte of `text`.

    With `eot_prefix` (the default) <|endoftext|> goes in front, as lm-evaluation-harness's rolling
    log-likelihood does, so the text's first token is scored too and bits per byte covers every byte of it;
    without it the first token is context only. `max_tokens` keeps the first N tokens (the prefix included).
    """
    tokens = tokenizer.encode(text)
    if eot_prefix:
        tokens = [tokenizer.eot_token, *tokens]
    return _perplexity_with_bytes(
        model,
        tokenizer,
        tokens,
        max_tokens=max_tokens,
        context_length=context_length,
        stride=stride,
        batch_size=batch_size,
        progress=progress,
    )


def perplexity_of_split(
    model: GPT,
    tokenizer: TextTokenizer,
    data_dir: str | Path,
    split: str = "val",
    *,
    max_tokens: int | None = None,
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> PerplexityResult:
    """Perplexity and bits per byte of one split of a folder written by `gpt2 prepare`, as stored (it starts with
    <|endoftext|>). The folder must have been tokenized by `tokenizer` (same identity in its manifest)."""
    manifest = read_manifest(data_dir)
    saved = manifest.get("tokenizer", {}).get("identity")
    if saved and tokenizer.identity != saved:
        raise ValueError(
            f"{str(data_dir)!r} was tokenized with {saved}, not the model's tokenizer {tokenizer.identity}; "
            "prepare the data with the model's tokenizer or pass the right --tokenizer"
        )
    return _perplexity_with_bytes(
        model,
        tokenizer,
        load_split(data_dir, split),
        max_tokens=max_tokens,
        context_length=context_length,
        stride=stride,
        batch_size=batch_size,
        progress=progress,
    )


def evaluate_perplexity(
    model: GPT,
    tokenizer: TextTokenizer,
    data: str | Path,
    *,
    split: str = "val",
    eot_prefix: bool = True,
    max_tokens: int | None = None,
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, Any]:
    """Perplexity of `data`: a UTF-8 text file (`perplexity_of_text`, `eot_prefix` applies) or a prepared folder
    (`perplexity_of_split` of `split`). Returns {"task", "data", "split" (None for a text file), then the fields
    of `PerplexityResult`}, as `gpt2 eval perplexity` reports them."""
    data = Path(data)
    if data.is_dir():
        result = perplexity_of_split(
            model,
            tokenizer,
            data,
            split,
            max_tokens=max_tokens,
            context_length=context_length,
            stride=stride,
            batch_size=batch_size,
            progress=progress,
        )
        used_split: str | None = split
    elif data.is_file():
        result = perplexity_of_text(
            model,
            tokenizer,
            read_text(data),
            eot_prefix=eot_prefix,
            max_tokens=max_tokens,
            context_length=context_length,
            stride=stride,
            batch_size=batch_size,
            progress=progress,
        )
        used_split = None
    else:
        raise FileNotFoundError(f"{str(data)!r} does not exist; pass a UTF-8 text file or a `gpt2 prepare` folder")
    return {"task": "perplexity", "data": str(data), "split": used_split, **result.to_dict()}
