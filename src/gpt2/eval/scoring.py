"""How a model rates a continuation after a context: the log-likelihood shared by HellaSwag and LAMBADA.

Texts become token pairs as lm-evaluation-harness makes them (`encode_pair`), pairs become right-padded rows,
one forward per batch, and the loss of the continuation's own tokens is summed (`score_continuations`).

Notation in tensor comments: B = rows in a batch, T = positions per row, V = vocab_size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpt2.eval.common import DEFAULT_BATCH_SIZE, evaluation_mode, model_device, progress_bar
from gpt2.model import GPT, IGNORE_INDEX
from gpt2.tokenizer.protocol import TextTokenizer


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


def encode_pair(tokenizer: TextTokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of a pair of texts, exactly as lm-evaluation-harness's `_encode_pair`.

    Whitespace at the end of the context moves to the front of the continuation, then the continuation's ids
    are what encoding the whole text adds after the context's ids:
    encode(context + continuation)[len(encode(context)):]. So the model is scored on the tokens it would see
    in running text: a context ending in "\\n    " before "return" is scored on the newline and indentation
    tokens too, not on a bare " return" that never follows "\\n   " in real code; likewise a double space.

    Where the harness leaves things undefined this is what happens: a context that is empty or only
    whitespace becomes <|endoftext|> (the harness's context for an empty one); a continuation that the whole
    text's encoding merges into the context's last token is encoded on its own (the harness would score
    nothing and call that a log-likelihood of 0).

    >>> from gpt2.tokenizer import ByteTokenizer
    >>> encode_pair(ByteTokenizer(), "ab  ", "c")
    ([97, 98], [32, 32, 99])
    """
    stripped = context.rstrip()
    continuation = context[len(stripped) :] + continuation
    if not stripped:
        return [tokenizer.eot_token], tokenizer.encode(continuation)
    context_ids = tokenizer.encode(stripped)
    continuation_ids = tokenizer.encode(stripped + continuation)[len(context_ids) :]
    if not continuation_ids:
        continuation_ids = tokenizer.encode(continuation)
    return context_ids, continuation_ids


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
    device = model_device(model)
    scores: list[ContinuationScore] = []
    starts = range(0, len(rows), batch_size)
    with evaluation_mode(model):
        for first in progress_bar(starts, enabled=progress, total=len(starts), desc=desc):
            batch = rows[first : first + batch_size]
            lengths = [len(row) - 1 for row in batch]  # inputs per row
            T = max(lengths)
            idx = torch.zeros(len(batch), T, dtype=torch.long)  # (B, T), pad id 0 is never scored
            targets = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
            for i, (row, length) in enumerate(zip(batch, lengths, strict=True)):
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


def score_texts(
    model: GPT,
    tokenizer: TextTokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
    desc: str = "scoring",
) -> list[ContinuationScore]:
    """Score (context, continuation) texts: `encode_pair` each, then `score_continuations`."""
    requests = [encode_pair(tokenizer, context, continuation) for context, continuation in pairs]
    return score_continuations(model, requests, batch_size=batch_size, progress=progress, desc=desc)
