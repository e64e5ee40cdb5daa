"""HellaSwag, completion style: each of the 4 endings is appended to the context and scored by its own tokens.

Reported: `acc` (lowest total loss), `acc_norm` (lowest mean loss per ending token: nanoGPT / llm.c's
"acc_norm") and `acc_char_norm` (lowest total loss per character of the ending: lm-evaluation-harness's
"acc_norm"). Prompts are rendered as nanoGPT / llm.c do (`style="nanogpt"`) or as the harness does
(`style="lm-eval"`); in both, texts become tokens as the harness makes them (`scoring.encode_pair`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gpt2.config import is_integer
from gpt2.eval.fewshot import FewShot, fewshot_contexts
from gpt2.eval.files import JsonlSource, describe_source, fetch_dataset, read_jsonl, require_field, reusable
from gpt2.eval.scoring import score_texts
from gpt2.model import GPT
from gpt2.tokenizer.protocol import TextTokenizer

HellaSwagStyle = Literal["nanogpt", "lm-eval"]
HELLASWAG_STYLES: tuple[str, ...] = ("nanogpt", "lm-eval")
HELLASWAG_NUM_ENDINGS = 4
HELLASWAG_HINT = "expected the official HellaSwag format (ctx, ctx_a, ctx_b, activity_label, endings, label)"


@dataclass(frozen=True)
class MultipleChoiceExample:
    """A rendered HellaSwag item: the model scores `context + endings[i]`; `label` is the right i."""

    context: str
    endings: tuple[str, ...]
    label: int
    normalizers: tuple[int, ...]
    """Characters of each ending without its leading space: lm-eval's acc_norm divides by these. 0 for an
    ending that is empty (as some are after the lm-eval clean-up): see `evaluate_hellaswag`."""


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
    endings = require_field(record, "endings", list, where, HELLASWAG_HINT)
    if len(endings) != HELLASWAG_NUM_ENDINGS or not all(isinstance(e, str) for e in endings):
        raise ValueError(f"{where}: 'endings' must be a list of {HELLASWAG_NUM_ENDINGS} strings; {HELLASWAG_HINT}")
    if "label" not in record or record["label"] in ("", None):
        raise ValueError(f"{where}: no 'label' (the test split has none); evaluate the val split instead")
    label = record["label"]
    if isinstance(label, str) and label.strip().isdigit():
        label = int(label)  # the Hub copy stores labels as strings
    if not is_integer(label) or not 0 <= label < HELLASWAG_NUM_ENDINGS:
        raise ValueError(f"{where}: 'label' must be an integer in [0, {HELLASWAG_NUM_ENDINGS}), got {label!r}")
    if style == "nanogpt":
        context = require_field(record, "ctx", str, where, HELLASWAG_HINT)
        cleaned = list(endings)
    else:
        ctx_a = require_field(record, "ctx_a", str, where, HELLASWAG_HINT)
        ctx_b = require_field(record, "ctx_b", str, where, HELLASWAG_HINT)
        activity = require_field(record, "activity_label", str, where, HELLASWAG_HINT)
        context = _lm_eval_preprocess(f"{activity}: {ctx_a} {ctx_b.capitalize()}")
        cleaned = [_lm_eval_preprocess(ending) for ending in endings]
    return MultipleChoiceExample(
        context=context,
        endings=tuple(" " + ending for ending in cleaned),
        label=label,
        normalizers=tuple(len(ending) for ending in cleaned),
    )


def read_hellaswag(
    source: JsonlSource, *, limit: int | None = None, style: HellaSwagStyle = "nanogpt"
) -> list[MultipleChoiceExample]:
    """The first `limit` examples (all by default) of a HellaSwag JSONL file or of in-memory records."""
    examples = [parse_hellaswag_record(record, where, style) for where, record in read_jsonl(source, limit)]
    if not examples:
        raise ValueError(f"no HellaSwag examples in {describe_source(source)}")
    return examples


def evaluate_hellaswag(
    model: GPT,
    tokenizer: TextTokenizer,
    source: JsonlSource | None = None,
    *,
    limit: int | None = None,
    style: HellaSwagStyle = "nanogpt",
    fewshot: FewShot | None = None,
    fewshot_source: JsonlSource | None = None,
    batch_size: int = 4 * HELLASWAG_NUM_ENDINGS,
    progress: bool = False,
) -> dict[str, Any]:
    """HellaSwag accuracy, completion style: every ending scored by the loss of its own tokens after the context.

    source: a JSONL file in the official format, in-memory records, or None to fetch the val split (online).
    fewshot: solved examples in front of each context, drawn as lm-evaluation-harness draws them
    (`gpt2.eval.fewshot`) from `fewshot_source`, by default the train split (fetched when needed, online); a shot
    is its rendered context, " " and its right ending. Default: zero-shot.
    Returns {"task", "style", "num_examples", "num_fewshot", "acc", "acc_norm", "acc_char_norm"}:

    - acc: the ending with the lowest summed loss (= highest log-likelihood; both nanoGPT and lm-eval's "acc");
    - acc_norm: the lowest mean loss per ending token (nanoGPT / llm.c's "acc_norm": 0.2955 for GPT-2 124M);
    - acc_char_norm: the lowest summed loss per character of the ending (lm-evaluation-harness's "acc_norm";
      with style="lm-eval" this is the harness's protocol: 0.3114 for GPT-2 124M).

    An ending that is empty (e.g. "[header]" after the lm-eval clean-up) is scored as the space before it, as
    the harness does; having no characters, its loss per character is infinite, so acc_char_norm never picks
    it (the harness divides by a length of 0 and gets -inf). Ties go to the lower index. Cheap enough to call
    from a training loop with `limit`; the model's train/eval mode is restored.
    """
    if source is None:
        source = fetch_dataset("hellaswag")
    fewshot = fewshot or FewShot()
    source = reusable(source)
    examples = read_hellaswag(source, limit=limit, style=style)
    contexts = [example.context for example in examples]
    if fewshot.k:
        contexts = hellaswag_fewshot_contexts(source, fewshot_source, fewshot, limit=limit, style=style)
    pairs = [
        (context, ending) for context, example in zip(contexts, examples, strict=True) for ending in example.endings
    ]
    scores = score_texts(model, tokenizer, pairs, batch_size=batch_size, progress=progress, desc="hellaswag")

    correct = {"acc": 0, "acc_norm": 0, "acc_char_norm": 0}
    for number, example in enumerate(examples):
        options = scores[number * HELLASWAG_NUM_ENDINGS : (number + 1) * HELLASWAG_NUM_ENDINGS]
        choices = {
            "acc": [s.loss_sum for s in options],
            "acc_norm": [s.loss_mean for s in options],
            "acc_char_norm": [  # an empty ending has no characters: infinite, never chosen
                s.loss_sum / n if n else math.inf for s, n in zip(options, example.normalizers, strict=True)
            ],
        }
        for metric, losses in choices.items():
            correct[metric] += int(int(np.argmin(losses)) == example.label)  # argmin: first of equal losses
    n = len(examples)
    metrics = {k: v / n for k, v in correct.items()}
    return {"task": "hellaswag", "style": style, "num_examples": n, "num_fewshot": fewshot.k, **metrics}


def hellaswag_fewshot_contexts(
    source: JsonlSource,
    fewshot_source: JsonlSource | None,
    fewshot: FewShot,
    *,
    limit: int | None = None,
    style: HellaSwagStyle = "nanogpt",
) -> list[str]:
    """The context of each of the first `limit` examples of `source` with `fewshot.k` solved train examples in
    front. As in the harness's HellaSwag task, which has no test split: k + 1 examples drawn, the evaluated one
    dropped if among them (`FewShotSampler.sample`). The pool is every example of `fewshot_source` (default: the
    train split, fetched once)."""
    pool_source = fewshot_source if fewshot_source is not None else fetch_dataset("hellaswag_train")
    pool = [record for _, record in read_jsonl(pool_source, None)]
    where = f"{describe_source(pool_source)} (a few-shot example)"

    def query_and_answer(record: Any) -> tuple[str, str]:
        example = parse_hellaswag_record(record, where, style)
        return example.context, example.endings[example.label].removeprefix(" ")  # the delimiter goes between

    docs = [record for _, record in read_jsonl(source, limit)]
    return fewshot_contexts(docs, query_and_answer, pool, fewshot, exclude_self=True)
