"""LAMBADA: the last word of each passage, predicted after the rest (OpenAI's file, "lambada_openai" in
lm-evaluation-harness). Scored as the harness does: accuracy of greedy decoding, perplexity per word."""

from __future__ import annotations

import math
from typing import Any

from gpt2.eval.common import DEFAULT_BATCH_SIZE
from gpt2.eval.fewshot import FewShot, fewshot_contexts
from gpt2.eval.files import JsonlSource, describe_source, fetch_dataset, read_jsonl, require_field, reusable
from gpt2.eval.scoring import score_texts
from gpt2.model import GPT
from gpt2.tokenizer.protocol import TextTokenizer

LAMBADA_HINT = 'expected LAMBADA (OpenAI) JSONL: one {"text": "..."} per line, the last word being the target'


def parse_lambada_record(record: Any, where: str) -> tuple[str, str]:
    """(context, target) of one LAMBADA record: the text split at its last space; the target keeps the space
    in front (" word"), as lm-evaluation-harness does, so BPE sees the word as it appears in running text.
    Whitespace the context ends with (a double space, a line's indentation) is scored with the target: see
    `scoring.encode_pair`."""
    text = require_field(record, "text", str, where, LAMBADA_HINT)
    context, space, word = text.rpartition(" ")
    if not space or not context or not word:
        raise ValueError(
            f"{where}: the text has no 'context last-word' split at a space: {text[:60]!r}; {LAMBADA_HINT}"
        )
    return context, " " + word


def read_lambada(source: JsonlSource, *, limit: int | None = None) -> list[tuple[str, str]]:
    """The first `limit` (context, target) pairs (all by default) of a LAMBADA JSONL file or in-memory records."""
    pairs = [parse_lambada_record(record, where) for where, record in read_jsonl(source, limit)]
    if not pairs:
        raise ValueError(f"no LAMBADA examples in {describe_source(source)}")
    return pairs


def evaluate_lambada(
    model: GPT,
    tokenizer: TextTokenizer,
    source: JsonlSource | None = None,
    *,
    limit: int | None = None,
    fewshot: FewShot | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, Any]:
    """LAMBADA last-word prediction. source: JSONL file, records, or None to fetch OpenAI's test file (online).

    fewshot: solved passages in front of each one, drawn as lm-evaluation-harness's lambada_openai draws them
    (`gpt2.eval.fewshot`): from the whole test file, the one evaluated not excluded (the task sets no few-shot
    split, and the harness excludes a document only from a few-shot split named as its test split). A shot is
    context + " " + target, and the target keeps its own leading space: two spaces before the word, as in the
    harness. Default: zero-shot.

    Returns {"task", "num_examples", "num_fewshot", "acc", "perplexity", "token_perplexity"}:

    - acc: fraction of passages whose target word comes out of greedy decoding, every token of it;
    - perplexity: exp(mean over passages of the target word's summed loss): per word, lm-eval's "perplexity";
    - token_perplexity: exp(total target loss / total target tokens).
    """
    if source is None:
        source = fetch_dataset("lambada")
    fewshot = fewshot or FewShot()
    source = reusable(source)
    pairs = read_lambada(source, limit=limit)
    if fewshot.k:
        contexts = fewshot_contexts(pairs, lambda pair: pair, read_lambada(source), fewshot)
        pairs = [(context, target) for context, (_, target) in zip(contexts, pairs, strict=True)]
    scores = score_texts(model, tokenizer, pairs, batch_size=batch_size, progress=progress, desc="lambada")
    n = len(scores)
    total_loss = sum(s.loss_sum for s in scores)
    return {
        "task": "lambada",
        "num_examples": n,
        "num_fewshot": fewshot.k,
        "acc": sum(s.greedy for s in scores) / n,
        "perplexity": math.exp(total_loss / n),
        "token_perplexity": math.exp(total_loss / sum(s.num_tokens for s in scores)),
    }
