"""A multiple-choice task of your own: a JSONL file, one question per line, scored as lm-evaluation-harness scores
a `multiple_choice` task.

    {"query": "The capital of France is", "choices": ["Paris", "Rome", "Berlin"], "label": 0}

Each choice is scored as the continuation `target_delimiter + choice` (" Paris") after the query, with the few-shot
examples in front when asked (`gpt2.eval.fewshot`). Reported: `acc` (the choice with the highest log-likelihood)
and `acc_norm` (the highest log-likelihood per character of the choice: the harness's acc_norm).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpt2.eval.common import DEFAULT_BATCH_SIZE
from gpt2.eval.fewshot import FewShot, fewshot_contexts
from gpt2.eval.files import JsonlSource, describe_source, read_jsonl, require_field, reusable
from gpt2.eval.scoring import ContinuationScore, score_texts
from gpt2.model import GPT
from gpt2.tokenizer.protocol import TextTokenizer

CHOICE_HINT = 'expected one {"query": "...", "choices": ["...", ...], "label": <index of the right choice>} per line'


def check_choice_record(record: Any, where: str) -> Mapping[str, Any]:
    """Refuse a record that is not {"query": str, "choices": [str, ...] (2 or more), "label": int in range}."""
    require_field(record, "query", str, where, CHOICE_HINT)
    choices = require_field(record, "choices", list, where, CHOICE_HINT)
    if len(choices) < 2 or not all(isinstance(choice, str) and choice for choice in choices):
        raise ValueError(f"{where}: 'choices' must be a list of 2 or more non-empty strings; {CHOICE_HINT}")
    label = require_field(record, "label", int, where, CHOICE_HINT)
    if not 0 <= label < len(choices):
        raise ValueError(f"{where}: 'label' {label} is not an index of the {len(choices)} choices; {CHOICE_HINT}")
    return record


def read_choice_records(source: JsonlSource, *, limit: int | None = None) -> list[Mapping[str, Any]]:
    """The first `limit` questions (all by default) of a multiple-choice JSONL file or of in-memory records."""
    records = [check_choice_record(record, where) for where, record in read_jsonl(source, limit)]
    if not records:
        raise ValueError(f"no questions in {describe_source(source)}; {CHOICE_HINT}")
    return records


def choice_query_and_answer(record: Mapping[str, Any]) -> tuple[str, str]:
    """(query, text of the right choice): how a question is shown as a solved few-shot example."""
    return record["query"], record["choices"][record["label"]]


def choice_requests(
    records: list[Mapping[str, Any]],
    fewshot: FewShot,
    pool: list[Mapping[str, Any]],
    *,
    exclude_self: bool,
) -> list[tuple[str, str]]:
    """The (context, continuation) texts scored: one per choice of every record, in order; the few-shot
    examples drawn from `pool` (see `fewshot_contexts` for exclude_self)."""
    contexts = fewshot_contexts(records, choice_query_and_answer, pool, fewshot, exclude_self=exclude_self)
    return [
        (context, fewshot.target_delimiter + choice)
        for context, record in zip(contexts, records, strict=True)
        for choice in record["choices"]
    ]


def evaluate_choice(
    model: GPT,
    tokenizer: TextTokenizer,
    source: JsonlSource,
    *,
    fewshot: FewShot | None = None,
    fewshot_source: JsonlSource | None = None,
    limit: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, Any]:
    """Accuracy on a multiple-choice JSONL file (see the module docstring for its format).

    fewshot: examples in front of each question (default: zero-shot), drawn from every question of
    `fewshot_source` (e.g. a train split), else from every question of `source` with each question kept out of
    its own examples: the harness's two cases (a few-shot split apart from the test split, or the same one).
    Returns {"task", "num_examples", "num_fewshot", "acc", "acc_norm"}.
    """
    fewshot = fewshot or FewShot()
    source = reusable(source)
    records = read_choice_records(source, limit=limit)
    pool: list[Mapping[str, Any]] = []
    if fewshot.k:  # the whole file, as the harness samples from the whole split whatever its --limit
        pool = read_choice_records(fewshot_source if fewshot_source is not None else source)
    requests = choice_requests(records, fewshot, pool, exclude_self=fewshot_source is None)
    return _score(model, tokenizer, records, requests, fewshot, batch_size, progress)


def _score(
    model: GPT,
    tokenizer: TextTokenizer,
    records: list[Mapping[str, Any]],
    requests: list[tuple[str, str]],
    fewshot: FewShot,
    batch_size: int,
    progress: bool,
) -> dict[str, Any]:
    scores = score_texts(model, tokenizer, requests, batch_size=batch_size, progress=progress, desc="choice")
    correct = {"acc": 0, "acc_norm": 0}
    first = 0
    for record in records:
        options: list[ContinuationScore] = scores[first : first + len(record["choices"])]
        first += len(record["choices"])
        loglikelihoods = np.array([-score.loss_sum for score in options])
        lengths = np.array([float(len(choice)) for choice in record["choices"]])
        correct["acc"] += int(int(np.argmax(loglikelihoods)) == record["label"])
        correct["acc_norm"] += int(int(np.argmax(loglikelihoods / lengths)) == record["label"])
    n = len(records)
    return {"task": "choice", "num_examples": n, "num_fewshot": fewshot.k, **{k: v / n for k, v in correct.items()}}
