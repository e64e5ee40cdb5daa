"""Evaluation: perplexity / bits per byte of a text, HellaSwag and LAMBADA, as a Python API.

Three jobs, one idea: run the model over token rows and add up the cross-entropy of the positions that count.

- `perplexity(model, tokens, stride=...)`: sliding windows over a long token stream (the Hugging Face
  "perplexity of fixed-length models" recipe). Every token after the first is scored exactly once, with up to
  `context_length` tokens of context; windows advance by `stride` and all have the same length, so a batch of
  windows is one (B, T) tensor without padding.
- `evaluate_hellaswag(model, tokenizer, path)`: completion-style multiple choice. Each of the 4 endings is
  appended to the context and scored by its own tokens' loss. Reported: `acc` (lowest total loss), `acc_norm`
  (lowest mean loss per ending token: nanoGPT / llm.c's "acc_norm") and `acc_char_norm` (lowest total loss per
  character of the ending: lm-evaluation-harness's "acc_norm").
- `evaluate_lambada(model, tokenizer, path)`: the last word of each passage must be produced by greedy decoding
  (every one of its tokens the argmax), plus the perplexity of the target word (lm-eval's convention).

All three switch the model to eval mode under `torch.no_grad()` and restore its previous mode, so the training
loop can call them on a model in train mode. `fetch_dataset` is this module's only network access (the public
HellaSwag / LAMBADA files, downloaded once into a cache folder).

Notation in tensor comments: B = rows in a batch, T = positions per row, V = vocab_size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gpt2.model import GPT, IGNORE_INDEX
from gpt2.runtime.files import atomic_write_bytes
from gpt2.tokenizer.protocol import TextTokenizer

HellaSwagStyle = Literal["nanogpt", "lm-eval"]
HELLASWAG_STYLES: tuple[str, ...] = ("nanogpt", "lm-eval")
HELLASWAG_NUM_ENDINGS = 4
DEFAULT_BATCH_SIZE = 8  # rows per forward: 8 x 1024 x 50257 fp32 logits is 1.6 GB, fine on CPU and GPU
COUNT_CHUNK_TOKENS = 1 << 24  # tokens per step when counting bytes: bounded memory on big shards
CACHE_ENV = "GPT2_CACHE"  # where fetched evaluation files go (default ~/.cache/gpt2)


# ------------------------------------------------------------------------------------------- model mode
@contextlib.contextmanager
def evaluation_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the block; the model's previous train/eval mode is restored
    afterwards, even on error, so the training loop can evaluate mid-run."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _progress(iterable: Iterable[Any], *, enabled: bool, total: int, desc: str) -> Iterable[Any]:
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="batch", dynamic_ncols=True)


# ------------------------------------------------------------------------------------------- perplexity
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


def _as_numpy_tokens(tokens: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    """A 1-D integer array view of `tokens` (a memory-mapped shard stays mapped: windows are sliced lazily)."""
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
    tokens: Sequence[int] | np.ndarray | torch.Tensor,
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

    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257))  # doctest: +SKIP
    >>> perplexity(model, tokens, stride=64).perplexity                 # doctest: +SKIP
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
    device = _device_of(model)

    total_nll = 0.0  # python float (float64): exact enough over hundreds of millions of tokens
    total_scored = 0
    batches = [windows[i : i + batch_size] for i in range(0, len(windows), batch_size)]
    with evaluation_mode(model):
        for batch in _progress(batches, enabled=progress, total=len(batches), desc="perplexity"):
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


def token_byte_lengths(tokenizer: TextTokenizer, vocab_size: int) -> np.ndarray:
    """(vocab_size,) UTF-8 byte length of each token id; special tokens (<|endoftext|>) count 0 bytes: they
    separate documents, they are not text."""
    special = set(getattr(tokenizer, "special_tokens", {}).values()) | {tokenizer.eot_token}
    lengths = np.zeros(vocab_size, dtype=np.int64)
    for token_id in range(vocab_size):
        if token_id not in special:
            lengths[token_id] = len(tokenizer.decode_bytes([token_id]))
    return lengths


def count_bytes(tokenizer: TextTokenizer, tokens: Sequence[int] | np.ndarray, vocab_size: int | None = None) -> int:
    """UTF-8 bytes of the text `tokens` decode to, special tokens excluded (byte-level BPE is lossless, so
    for tokens = encode(text) this is len(text.encode("utf-8")))."""
    array = _as_numpy_tokens(tokens)
    if array.size == 0:
        return 0
    vocab_size = int(array.max()) + 1 if vocab_size is None else vocab_size
    lengths = token_byte_lengths(tokenizer, vocab_size)
    total = 0
    for first in range(0, len(array), COUNT_CHUNK_TOKENS):  # chunks: a memory-mapped shard is never copied whole
        chunk = np.asarray(array[first : first + COUNT_CHUNK_TOKENS], dtype=np.int64)
        total += int(np.bincount(chunk, minlength=vocab_size) @ lengths)  # occurrences per id x bytes per id
    return total


# ------------------------------------------------------------------------------- continuation scoring
@dataclass(frozen=True)
class ContinuationScore:
    """How the model rates `continuation` after `context`."""

    loss_sum: float
    """Negative log-likelihood of the continuation tokens, summed (nats)."""
    num_tokens: int
    greedy: bool
    """True when every continuation token is the model's argmax at its position."""

    @property
    def loss_mean(self) -> float:
        return self.loss_sum / self.num_tokens


def score_continuations(
    model: GPT,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
    desc: str = "scoring",
) -> list[ContinuationScore]:
    """Score (context tokens, continuation tokens) pairs: one row per pair, right-padded into batches.

    A row is context + continuation, cut from the left to block_size + 1 tokens (the continuation is always
    kept whole). Right padding cannot change real positions under causal attention, so no attention mask is
    needed; padded targets are IGNORE_INDEX.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    block_size = model.config.block_size
    rows: list[list[int]] = []
    for number, (context, continuation) in enumerate(requests):
        if not context:
            raise ValueError(f"request {number} has an empty context; give at least one token (e.g. <|endoftext|>)")
        if not continuation:
            raise ValueError(f"request {number} has an empty continuation; there is nothing to score")
        if len(continuation) > block_size:
            raise ValueError(
                f"request {number}: the continuation has {len(continuation)} tokens, more than the model's "
                f"block_size={block_size}; it cannot be scored in one window"
            )
        rows.append([*context, *continuation][-(block_size + 1) :])
    device = _device_of(model)
    scores: list[ContinuationScore] = []
    starts = range(0, len(rows), batch_size)
    with evaluation_mode(model):
        for first in _progress(starts, enabled=progress, total=len(starts), desc=desc):
            batch = rows[first : first + batch_size]
            lengths = [len(row) - 1 for row in batch]  # inputs per row
            T = max(lengths)
            idx = torch.zeros(len(batch), T, dtype=torch.long)  # (B, T), pad id 0 is never scored
            targets = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
            for i, (row, length) in enumerate(zip(batch, lengths)):
                n_cont = len(requests[first + i][1])
                idx[i, :length] = torch.tensor(row[:-1])
                targets[i, length - n_cont : length] = torch.tensor(row[-n_cont:])  # only the continuation
            idx, targets = idx.to(device), targets.to(device)
            logits = model(idx).logits.float()  # (B, T, V)
            nll = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
            scored = targets != IGNORE_INDEX  # (B, T)
            hits = (logits.argmax(dim=-1) == targets) | ~scored
            for i in range(len(batch)):
                scores.append(
                    ContinuationScore(
                        loss_sum=float(nll[i].sum()),  # ignored positions are 0 in reduction="none"
                        num_tokens=int(scored[i].sum()),
                        greedy=bool(hits[i].all()),
                    )
                )
    return scores


# ---------------------------------------------------------------------------------------- JSONL input
def _read_jsonl(source: str | Path | Iterable[Mapping[str, Any]], limit: int | None) -> Iterator[tuple[str, Any]]:
    """(where, record) pairs: 'FILE:LINE' for a file (blank lines skipped), 'example N' for in-memory records."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be positive when given, got {limit}")
    count = 0
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{str(path)!r} does not exist or is not a file; pass the JSONL file's path")
        with path.open("r", encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if limit is not None and count >= limit:
                    return
                if not line.strip():
                    continue
                where = f"{path}:{line_number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{where}: not valid JSON ({err.msg}); each line must be one JSON object") from err
                count += 1
                yield where, record
        return
    for number, record in enumerate(source):
        if limit is not None and count >= limit:
            return
        count += 1
        yield f"example {number}", record


def _field(record: Any, name: str, kind: type, where: str, hint: str) -> Any:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}; {hint}")
    if name not in record:
        raise ValueError(f"{where}: missing field {name!r}; {hint}")
    value = record[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: field {name!r} must be {kind.__name__}, got {type(value).__name__}; {hint}")
    return value


# ------------------------------------------------------------------------------------------- HellaSwag
HELLASWAG_HINT = "expected the official HellaSwag format (ctx, ctx_a, ctx_b, activity_label, endings, label)"


@dataclass(frozen=True)
class MultipleChoiceExample:
    """A rendered HellaSwag item: the model scores `context + endings[i]`; `label` is the right i."""

    context: str
    endings: tuple[str, ...]
    label: int
    normalizers: tuple[int, ...]
    """Characters of each ending without its leading space: lm-eval's acc_norm divides by these."""


def _lm_eval_preprocess(text: str) -> str:
    """lm-evaluation-harness's HellaSwag clean-up: WikiHow's "[title]" marks become sentence breaks, other
    bracketed tags go, double spaces collapse."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def parse_hellaswag_record(record: Any, where: str, style: HellaSwagStyle = "nanogpt") -> MultipleChoiceExample:
    """One official-format HellaSwag record -> the texts to score, rendered as `style` does.

    "nanogpt" (nanoGPT / llm.c): context = ctx, endings " " + ending. "lm-eval" (lm-evaluation-harness):
    context = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()), endings " " +
    preprocess(ending).
    """
    if style not in HELLASWAG_STYLES:
        raise ValueError(f"unknown HellaSwag style {style!r}; choose one of {', '.join(HELLASWAG_STYLES)}")
    endings = _field(record, "endings", list, where, HELLASWAG_HINT)
    if len(endings) != HELLASWAG_NUM_ENDINGS or not all(isinstance(e, str) for e in endings):
        raise ValueError(f"{where}: 'endings' must be a list of {HELLASWAG_NUM_ENDINGS} strings; {HELLASWAG_HINT}")
    if "label" not in record or record["label"] in ("", None):
        raise ValueError(f"{where}: no 'label' (the test split has none); evaluate the val split instead")
    label = record["label"]
    if isinstance(label, str) and label.strip().isdigit():
        label = int(label)  # the Hub copy stores labels as strings
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < HELLASWAG_NUM_ENDINGS:
        raise ValueError(f"{where}: 'label' must be an integer in [0, {HELLASWAG_NUM_ENDINGS}), got {label!r}")
    if style == "nanogpt":
        context = _field(record, "ctx", str, where, HELLASWAG_HINT)
        cleaned = list(endings)
    else:
        ctx_a = _field(record, "ctx_a", str, where, HELLASWAG_HINT)
        ctx_b = _field(record, "ctx_b", str, where, HELLASWAG_HINT)
        activity = _field(record, "activity_label", str, where, HELLASWAG_HINT)
        context = _lm_eval_preprocess(f"{activity}: {ctx_a} {ctx_b.capitalize()}")
        cleaned = [_lm_eval_preprocess(ending) for ending in endings]
    return MultipleChoiceExample(
        context=context,
        endings=tuple(" " + ending for ending in cleaned),
        label=label,
        normalizers=tuple(max(1, len(ending)) for ending in cleaned),
    )


def read_hellaswag(
    source: str | Path | Iterable[Mapping[str, Any]], *, limit: int | None = None, style: HellaSwagStyle = "nanogpt"
) -> list[MultipleChoiceExample]:
    """The first `limit` examples (all by default) of a HellaSwag JSONL file or of in-memory records."""
    examples = [parse_hellaswag_record(record, where, style) for where, record in _read_jsonl(source, limit)]
    if not examples:
        raise ValueError(f"no HellaSwag examples in {source if isinstance(source, (str, Path)) else 'the records'}")
    return examples


def evaluate_hellaswag(
    model: GPT,
    tokenizer: TextTokenizer,
    source: str | Path | Iterable[Mapping[str, Any]] | None = None,
    *,
    limit: int | None = None,
    style: HellaSwagStyle = "nanogpt",
    batch_size: int = 4 * HELLASWAG_NUM_ENDINGS,
    progress: bool = False,
) -> dict[str, Any]:
    """HellaSwag accuracy, completion style: every ending scored by the loss of its own tokens after the context.

    source: a JSONL file in the official format, in-memory records, or None to fetch the val split (online).
    Returns {"task", "style", "num_examples", "acc", "acc_norm", "acc_char_norm"}:

    - acc: the ending with the lowest summed loss (= highest log-likelihood; both nanoGPT and lm-eval's "acc");
    - acc_norm: the lowest mean loss per ending token (nanoGPT / llm.c's "acc_norm": 0.2955 for GPT-2 124M);
    - acc_char_norm: the lowest summed loss per character of the ending (lm-evaluation-harness's "acc_norm";
      with style="lm-eval" this is the harness's protocol: 0.3114 for GPT-2 124M).

    Ties go to the lower index. Cheap enough to call from a training loop with `limit`; the model's train/eval
    mode is restored.
    """
    if source is None:
        source = fetch_dataset("hellaswag")
    examples = read_hellaswag(source, limit=limit, style=style)
    requests: list[tuple[list[int], list[int]]] = []
    for example in examples:
        context = tokenizer.encode(example.context)
        requests.extend((context, tokenizer.encode(ending)) for ending in example.endings)
    scores = score_continuations(model, requests, batch_size=batch_size, progress=progress, desc="hellaswag")

    correct = {"acc": 0, "acc_norm": 0, "acc_char_norm": 0}
    for number, example in enumerate(examples):
        options = scores[number * HELLASWAG_NUM_ENDINGS : (number + 1) * HELLASWAG_NUM_ENDINGS]
        choices = {
            "acc": [s.loss_sum for s in options],
            "acc_norm": [s.loss_mean for s in options],
            "acc_char_norm": [s.loss_sum / n for s, n in zip(options, example.normalizers)],
        }
        for metric, losses in choices.items():
            correct[metric] += int(int(np.argmin(losses)) == example.label)  # argmin: first of equal losses
    n = len(examples)
    return {"task": "hellaswag", "style": style, "num_examples": n, **{k: v / n for k, v in correct.items()}}


# --------------------------------------------------------------------------------------------- LAMBADA
LAMBADA_HINT = 'expected LAMBADA (OpenAI) JSONL: one {"text": "..."} per line, the last word being the target'


def parse_lambada_record(record: Any, where: str) -> tuple[str, str]:
    """(context, target) of one LAMBADA record: the text split at its last space; the target keeps the space
    in front (" word"), as lm-evaluation-harness does, so BPE sees the word as it appears in running text."""
    text = _field(record, "text", str, where, LAMBADA_HINT)
    context, space, word = text.rpartition(" ")
    if not space or not context or not word:
        raise ValueError(
            f"{where}: the text has no 'context last-word' split at a space: {text[:60]!r}; {LAMBADA_HINT}"
        )
    return context, " " + word


def read_lambada(
    source: str | Path | Iterable[Mapping[str, Any]], *, limit: int | None = None
) -> list[tuple[str, str]]:
    """The first `limit` (context, target) pairs (all by default) of a LAMBADA JSONL file or in-memory records."""
    pairs = [parse_lambada_record(record, where) for where, record in _read_jsonl(source, limit)]
    if not pairs:
        raise ValueError(f"no LAMBADA examples in {source if isinstance(source, (str, Path)) else 'the records'}")
    return pairs


def evaluate_lambada(
    model: GPT,
    tokenizer: TextTokenizer,
    source: str | Path | Iterable[Mapping[str, Any]] | None = None,
    *,
    limit: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, Any]:
    """LAMBADA last-word prediction. source: JSONL file, records, or None to fetch OpenAI's test file (online).

    Returns {"task", "num_examples", "acc", "perplexity", "token_perplexity"}:

    - acc: fraction of passages whose target word comes out of greedy decoding, every token of it;
    - perplexity: exp(mean over passages of the target word's summed loss): per word, lm-eval's "perplexity";
    - token_perplexity: exp(total target loss / total target tokens).
    """
    if source is None:
        source = fetch_dataset("lambada")
    pairs = read_lambada(source, limit=limit)
    requests = [(tokenizer.encode(context), tokenizer.encode(target)) for context, target in pairs]
    scores = score_continuations(model, requests, batch_size=batch_size, progress=progress, desc="lambada")
    n = len(scores)
    total_loss = sum(s.loss_sum for s in scores)
    return {
        "task": "lambada",
        "num_examples": n,
        "acc": sum(s.greedy for s in scores) / n,
        "perplexity": math.exp(total_loss / n),
        "token_perplexity": math.exp(total_loss / sum(s.num_tokens for s in scores)),
    }


# ------------------------------------------------------------------------------------ fetching data
@dataclass(frozen=True)
class RemoteFile:
    url: str
    filename: str
    sha256: str | None  # checked after download when known


DATASETS: dict[str, RemoteFile] = {
    # Rowan Zellers' official release; the val split (10,042 items) is what everyone reports.
    "hellaswag": RemoteFile(
        "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl",
        "hellaswag_val.jsonl",
        None,  # no published checksum to pin
    ),
    # OpenAI's detokenized LAMBADA test set (5,153 passages), "lambada_openai" in lm-evaluation-harness.
    "lambada": RemoteFile(
        "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl",
        "lambada_test.jsonl",
        "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226",
    ),
}


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "gpt2")).expanduser() / "eval"


def fetch_dataset(name: str, cache_dir: str | Path | None = None) -> Path:
    """Local path of a public evaluation file ("hellaswag" val or "lambada" test), downloaded once.

    The file is written atomically (a partial download never looks complete) and checked against its sha256
    when known. Offline, raises FileNotFoundError saying where to put the file or how to pass it.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown evaluation dataset {name!r}; choose one of {', '.join(DATASETS)}")
    remote = DATASETS[name]
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = directory / remote.filename
    if path.is_file():
        return path
    try:
        with urllib.request.urlopen(remote.url, timeout=60) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as err:
        raise FileNotFoundError(
            f"{name} is not in {str(path)!r} and downloading {remote.url} failed ({err}); download it there by "
            "hand, or pass a local file (--data PATH)"
        ) from err
    digest = hashlib.sha256(data).hexdigest()
    if remote.sha256 is not None and digest != remote.sha256:
        raise ValueError(f"{remote.url} has sha256 {digest}, expected {remote.sha256}; the download is corrupt")
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)
    return path
