"""Fine-tuning data: files read into token rows with per-token loss masks, split, and served as batches.

Formats (chosen by the file, see `load_examples`):

- a text file, or a folder of them: documents separated by `<|endoftext|>`, packed into blocks; every token
  is a target;
- JSONL with a text field (`{"text": ...}`): each record one document, packed the same way;
- CSV with a chosen column: each row one document;
- prompt/completion JSONL (`{"prompt": ..., "completion": ...}`): one row per pair, loss on the completion only;
- chat JSONL (`{"messages": [{"role": ..., "content": ...}, ...]}`): one row per conversation in the chat
  template of `gpt2.finetune.chat`, loss on the assistant turns only.

A row is T + 1 token ids; its batch pair is x = ids[:-1] and y = ids[1:] with IGNORE_INDEX where the next token
is not a target (prompt, user turns, padding).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpt2.model import IGNORE_INDEX
from gpt2.runtime.files import iter_jsonl_objects, read_utf8_text
from gpt2.tokenizer.chat import encode_chat
from gpt2.tokenizer.protocol import TextTokenizer

END_OF_TEXT = "<|endoftext|>"
TEXT_SUFFIXES = (".txt", ".md", ".text")


@dataclass
class Example:
    """One tokenized piece of training data: ids and, for each id, whether predicting it counts in the loss."""

    ids: list[int]
    trained: list[bool]
    packed: bool = True
    """Plain text, which is packed into blocks across documents; masked examples keep one row each."""


@dataclass
class Rows:
    """Token rows ready for batching: inputs x (N, T) and targets y (N, T), plus what was cut or dropped."""

    x: torch.Tensor
    y: torch.Tensor
    truncated: int = 0
    dropped: int = 0
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.x.shape[0]


def load_examples(path: str | Path, tokenizer: TextTokenizer, *, column: str | None = None,
                  text_field: str = "text") -> list[Example]:  # fmt: skip
    """The examples of a text file or folder, a JSONL file (text, prompt/completion or chat records, detected per
    record) or a CSV file (`column` names the text column). Bad records raise ValueError naming file:line."""
    source = Path(path).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"data {source} does not exist; pass a text file or folder, .jsonl or .csv")
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not files:
            raise ValueError(f"data folder {source} holds no {'/'.join(TEXT_SUFFIXES)} files")
        return [example for file in files for example in _text_examples(read_utf8_text(file), tokenizer)]
    text = read_utf8_text(source)  # a byte that is not UTF-8 is named by file:line before any record is read
    if source.suffix == ".jsonl":
        return _jsonl_examples(source, tokenizer, text_field)
    if source.suffix == ".csv":
        return _csv_examples(source, tokenizer, column)
    return _text_examples(text, tokenizer)


def _document(text: str, tokenizer: TextTokenizer) -> Example:
    ids = [*tokenizer.encode(text), tokenizer.eot_token]  # end-of-text closes every document, as in pretraining
    return Example(ids, [True] * len(ids))


def _text_examples(text: str, tokenizer: TextTokenizer) -> list[Example]:
    return [_document(doc.strip("\n"), tokenizer) for doc in text.split(END_OF_TEXT) if doc.strip()]


def _jsonl_examples(path: Path, tokenizer: TextTokenizer, text_field: str) -> list[Example]:
    examples = []
    for where, record in iter_jsonl_objects(path):
        examples.append(_record_example(record, tokenizer, text_field, where))
    if not examples:
        raise ValueError(f"{path} holds no records")
    return examples


def _record_example(record: dict[str, Any], tokenizer: TextTokenizer, text_field: str, where: str) -> Example:
    if "messages" in record:
        ids, trained = encode_chat(record["messages"], tokenizer, where=where)
        return Example(ids, trained, packed=False)
    if "prompt" in record or "completion" in record:
        prompt, completion = record.get("prompt"), record.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise ValueError(f"{where}: a prompt/completion record needs both 'prompt' and 'completion' strings")
        prompt_ids = tokenizer.encode(prompt)
        completion_ids = [*tokenizer.encode(completion), tokenizer.eot_token]
        return Example(prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids),
                       packed=False)  # fmt: skip
    if isinstance(record.get(text_field), str):
        return _document(record[text_field], tokenizer)
    raise ValueError(
        f"{where}: no {text_field!r}, 'prompt'/'completion' or 'messages' field (keys: {sorted(record)}); "
        "set text_field=NAME for another text field"
    )


def _csv_examples(path: Path, tokenizer: TextTokenizer, column: str | None) -> list[Example]:
    with path.open(encoding="utf-8", newline="") as file:
        reader = csv.DictReader(file)
        columns = reader.fieldnames or []
        if column is None or column not in columns:
            raise ValueError(f"{path}:1: choose the text column with text_column=NAME (columns: {columns})")
        return [_document(row[column], tokenizer) for row in reader if row[column]]


def make_rows(examples: Sequence[Example], block_size: int, pad_id: int) -> Rows:
    """Rows of block_size + 1 ids: packed text cut into consecutive blocks (the last partial one dropped when
    there is more than one), each masked example alone in its row, padded (not trained) or cut to fit."""
    width = block_size + 1
    rows_ids: list[list[int]] = []
    rows_trained: list[list[bool]] = []
    stream_ids: list[int] = []
    stream_trained: list[bool] = []
    truncated = 0
    for example in examples:
        if example.packed:
            stream_ids += example.ids
            stream_trained += example.trained
            continue
        ids, trained = example.ids, example.trained
        if len(ids) > width:
            truncated += 1
            ids, trained = ids[:width], trained[:width]
        pad = width - len(ids)
        rows_ids.append(ids + [pad_id] * pad)
        rows_trained.append(trained + [False] * pad)
    dropped = sum(1 for trained in rows_trained if not any(trained[1:]))  # cut so far that no target is left
    kept = [i for i, trained in enumerate(rows_trained) if any(trained[1:])]
    rows_ids = [rows_ids[i] for i in kept]
    rows_trained = [rows_trained[i] for i in kept]
    # packed text: blocks of `width` that overlap by one token, so every token is a target once
    if stream_ids:
        starts = range(0, max(len(stream_ids) - 1, 1), block_size)
        for start in starts:
            ids, trained = stream_ids[start : start + width], stream_trained[start : start + width]
            if len(ids) < width:
                if len(starts) > 1 and len(ids) < width // 2:
                    break  # a short tail: not worth a mostly padded row
                pad = width - len(ids)
                ids, trained = ids + [pad_id] * pad, trained + [False] * pad
            rows_ids.append(ids)
            rows_trained.append(trained)
    if not rows_ids:
        raise ValueError("the data gives no training rows (every example was empty or cut away)")
    ids_tensor = torch.tensor(rows_ids, dtype=torch.long)  # (N, T + 1)
    trained_tensor = torch.tensor(rows_trained, dtype=torch.bool)
    y = ids_tensor[:, 1:].masked_fill(~trained_tensor[:, 1:], IGNORE_INDEX)  # (N, T)
    notes = []
    if truncated:
        notes.append(f"{truncated} examples longer than block_size + 1 = {width} tokens were cut to fit")
    if dropped:
        notes.append(f"{dropped} examples were dropped: cut to block_size, nothing trained was left")
    return Rows(ids_tensor[:, :-1].contiguous(), y.contiguous(), truncated, dropped, notes)


def split_rows(rows: Rows, val_fraction: float, seed: int) -> tuple[Rows, Rows]:
    """A seeded shuffle, then the last val_fraction of the rows (at least one, when there are two) as val."""
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))
    n_val = 0 if val_fraction <= 0 or len(rows) < 2 else max(1, round(len(rows) * val_fraction))
    train, val = order[: len(rows) - n_val], order[len(rows) - n_val :]
    return Rows(rows.x[train], rows.y[train]), Rows(rows.x[val], rows.y[val])


class RowBatches:
    """Batches of `batch_size` rows drawn without replacement in seeded epochs; state is (epoch, position).

    >>> rows = Rows(torch.zeros(5, 4, dtype=torch.long), torch.zeros(5, 4, dtype=torch.long))
    >>> RowBatches(rows, batch_size=2).next_batch()[0].shape
    torch.Size([2, 4])
    """

    def __init__(self, rows: Rows, batch_size: int, seed: int = 0) -> None:
        if len(rows) == 0:
            raise ValueError("no rows to draw batches from; give more data or lower val_fraction")
        self.rows = rows
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        return torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        picked: list[torch.Tensor] = []
        count = 0
        while count < self.batch_size:  # a batch may span the end of one epoch and the start of the next
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            take = self._order[self.position : self.position + self.batch_size - count]
            picked.append(take)
            count += len(take)
            self.position += len(take)
        index = torch.cat(picked)
        return self.rows.x[index], self.rows.y[index]  # (B, T) each

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation()
