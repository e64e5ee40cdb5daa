"""What a fine-tuning task brings to the Trainer: the model, its batches and loss, its evaluations, and how the
result is written. `language_model_task` (next-token loss on the rows' masked targets) and
`classification_task` (a score head on the last real token, val accuracy at each evaluation) read and check
everything before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from gpt2.api import LLM
from gpt2.finetune.classify import (
    ClassificationBatches,
    GPTForSequenceClassification,
    LabelSet,
    accuracy_evaluation,
    classification_loss,
    encode_texts,
    read_examples,
    save_classifier,
    split_examples,
)
from gpt2.finetune.config import FinetuneConfig
from gpt2.finetune.data import RowBatches, load_examples, make_rows, split_rows
from gpt2.model import GPT, CausalSelfAttention
from gpt2.runtime.device import resolve_device
from gpt2.runtime.files import atomic_directory
from gpt2.tokenizer.chat import save_chat_template
from gpt2.train.trainer import BatchSource, Evaluation, LossFn, next_token_loss
from gpt2.weights import save_pretrained

VAL_SEED_OFFSET = 1_000_003  # the val batches never share the train stream's order
MAX_BLOCK_SIZE = 1024


@dataclass
class FinetuneTask:
    """A task read and checked: the model (the pretrained one, or a classifier built on it) and its data."""

    llm: LLM
    model: GPT
    block_size: int
    """Tokens per row (classification: the longest cut text, what a micro-batch is padded to at most)."""
    train_count: int
    val_count: int
    unit: str
    """What a row is, for the log: "rows of 32 tokens"."""
    batches: Callable[[int, int], BatchSource]
    """(batch_size, seed) -> the train batches."""
    val_batches: Callable[[int, int], Callable[[], BatchSource]] | None
    """(batch_size, seed) -> a maker of fresh val batches (None without a val split)."""
    loss_fn: LossFn
    write: Callable[[GPT, Path], None]
    """Writes the output model and tokenizer into a folder (atomically, item by item)."""
    evaluations: Callable[[int], list[Evaluation]] = lambda batch_size: []
    notes: list[str] = field(default_factory=list)


def language_model_task(config: FinetuneConfig) -> FinetuneTask:
    """Next-token fine-tuning on text, prompt/completion or chat records (see `gpt2.finetune.data`)."""
    if not config.data:
        raise ValueError("no data: pass --data FILE_OR_FOLDER")
    llm = LLM.load(config.model, device=resolve_device(config.train.runtime.device))
    block_size = _block_size(config, llm.model)
    examples = load_examples(config.data, llm.tokenizer, column=config.text_column, text_field=config.text_field)
    rows = make_rows(examples, block_size, pad_id=llm.tokenizer.eot_token)
    train_rows, val_rows = split_rows(rows, config.train.data.val_fraction, config.train.runtime.seed)
    if len(train_rows) == 0:
        raise ValueError(f"{config.data} gives {len(rows)} rows, none left to train on; give more data")
    tokenizer = llm.tokenizer

    def val_batches(batch_size: int, seed: int) -> Callable[[], BatchSource]:
        return lambda: RowBatches(val_rows, batch_size, seed=seed + VAL_SEED_OFFSET)

    def write(model: GPT, out: Path) -> None:
        with atomic_directory(out) as staging:
            save_pretrained(model, staging)
            tokenizer.save(staging)
            save_chat_template(staging)

    return FinetuneTask(
        llm, llm.model, block_size, len(train_rows), len(val_rows), f"rows of {block_size} tokens",
        batches=lambda batch_size, seed: RowBatches(train_rows, batch_size, seed=seed),
        val_batches=val_batches if len(val_rows) else None, loss_fn=next_token_loss, write=write, notes=rows.notes,
    )  # fmt: skip


def classification_task(config: FinetuneConfig) -> FinetuneTask:
    """The pretrained model turned into a classifier (score head N(0, 0.02), seeded) on text + label records."""
    if not config.data:
        raise ValueError("no data: pass --data FILE (.jsonl or .csv with text and label)")
    llm = LLM.load(config.model, device=resolve_device(config.train.runtime.device))
    block_size = _block_size(config, llm.model)
    examples = read_examples(config.data, text_field=config.text_field, label_field=config.label_field)
    labels = LabelSet.from_values([e.label for e in examples])
    if len(labels) < 2:
        raise ValueError(f"{config.data}: every example has the label {labels.names[0]!r}; a classifier needs two")
    train, val = split_examples(examples, config.train.data.val_fraction, seed=config.train.runtime.seed)
    tokenizer = llm.tokenizer
    train_ids = encode_texts(tokenizer, [e.text for e in train], block_size)
    val_ids = encode_texts(tokenizer, [e.text for e in val], block_size)
    train_labels, val_labels = [labels.id_of(e.label) for e in train], [labels.id_of(e.label) for e in val]
    torch.manual_seed(config.train.runtime.seed)  # the score head's initialization
    model = GPTForSequenceClassification(llm.model.config, len(labels), pad_token_id=tokenizer.eot_token)
    result = model.load_state_dict(llm.model.state_dict(), strict=False)
    assert not result.unexpected_keys and list(result.missing_keys) == ["score.weight"], result
    model.to(llm.device)
    pad = tokenizer.eot_token
    longest = max(len(row) for row in train_ids + val_ids)

    def val_batches(batch_size: int, seed: int) -> Callable[[], BatchSource]:
        return lambda: ClassificationBatches(val_ids, val_labels, batch_size, pad, shuffle=False)

    def write(trained: GPT, out: Path) -> None:
        assert isinstance(trained, GPTForSequenceClassification)
        with atomic_directory(out) as staging:
            save_classifier(trained, staging, labels)
            tokenizer.save(staging)

    return FinetuneTask(
        llm, model, longest, len(train_labels), len(val_labels), f"texts of up to {block_size} tokens",
        batches=lambda batch_size, seed: ClassificationBatches(train_ids, train_labels, batch_size, pad, seed=seed),
        val_batches=val_batches, loss_fn=classification_loss, write=write,
        evaluations=lambda batch_size: [accuracy_evaluation(val_ids, val_labels, batch_size=batch_size)],
    )  # fmt: skip


TASKS: dict[str, Callable[[FinetuneConfig], FinetuneTask]] = {
    "lm": language_model_task,
    "classification": classification_task,
}


def _block_size(config: FinetuneConfig, model: GPT) -> int:
    context = model.config.block_size
    block_size = config.train.model.block_size or min(context, MAX_BLOCK_SIZE)
    if block_size > context:
        raise ValueError(
            f"block_size={block_size} is larger than the model's context of {context} tokens; set block_size<={context}"
        )
    return block_size


def set_dropout(model: GPT, dropout: float) -> None:
    """Set every dropout probability of `model` (and its config) to `dropout`."""
    model.config = dataclasses.replace(model.config, dropout=dropout)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = dropout
        elif isinstance(module, CausalSelfAttention):
            module.dropout = dropout  # the attention weights' dropout probability


__all__ = ["TASKS", "FinetuneTask", "classification_task", "language_model_task", "set_dropout"]
