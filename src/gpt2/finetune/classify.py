"""Sequence classification: GPT-2 plus a linear `score` head read at each sequence's last real token.

The layout is transformers' `GPT2ForSequenceClassification`: our `transformer.*` parameters and `score.weight`
[num_labels, C] without a bias. A directory written by `save_classifier` loads in
`transformers.GPT2ForSequenceClassification.from_pretrained`, and `load_classifier` reads what that class saves;
both compute the same logits.

Data is a JSONL file (one object per line) or a CSV file with a header, each row a text and a label. Labels are
all integers (class ids, names "0", "1", ...) or all strings (ids in sorted order); the mapping travels in
config.json as id2label / label2id.

    >>> labels = LabelSet.from_values(["spam", "ham", "spam"])
    >>> labels.names, labels.id_of("spam")
    (('ham', 'spam'), 1)
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2.config import GPTConfig, is_integer
from gpt2.model import GPT, INIT_STD
from gpt2.runtime.files import atomic_write_bytes, iter_jsonl_objects
from gpt2.tokenizer import TextTokenizer, load_tokenizer
from gpt2.weights.empty import empty_model
from gpt2.weights.hf import config_from_hf, config_to_hf, hf_state_dict, load_hf_state_dict, read_hf_state_dict

ARCHITECTURE = "GPT2ForSequenceClassification"
SCORE_WEIGHT = "score.weight"


class ClassifierOutput(NamedTuple):
    logits: torch.Tensor
    """(B, num_labels): the score head at each row's last real token."""
    loss: torch.Tensor | None
    """Mean cross-entropy against the labels, when given."""


class GPTForSequenceClassification(GPT):
    """GPT-2 with a classification head: token ids (B, T) -> logits (B, num_labels).

    The last real token of a row is the rightmost position with attention_mask 1; without a mask, the rightmost
    token that is not pad_token_id (transformers' rule, which handles left and right padding alike); without
    either, position T-1. The LM head stays tied to wte (no extra parameters), so the backbone is still a GPT.

    >>> model = GPTForSequenceClassification(GPTConfig.from_name("gpt2-tiny", vocab_size=100), 3, pad_token_id=0)
    >>> model(torch.tensor([[5, 6, 0], [7, 0, 0]])).logits.shape
    torch.Size([2, 3])
    """

    def __init__(self, config: GPTConfig, num_labels: int, pad_token_id: int | None = None) -> None:
        if not is_integer(num_labels) or num_labels < 1:
            raise ValueError(f"num_labels must be a positive integer, got {num_labels!r}")
        if pad_token_id is not None and not 0 <= pad_token_id < config.vocab_size:
            raise ValueError(f"pad_token_id {pad_token_id} is not a token id of a vocabulary of {config.vocab_size}")
        super().__init__(config)
        self.num_labels = num_labels
        self.pad_token_id = pad_token_id
        self.score = nn.Linear(config.n_embd, num_labels, bias=False)
        nn.init.normal_(self.score.weight, mean=0.0, std=INIT_STD)

    def forward(  # type: ignore[override]  # a classifier's output, not next-token logits
        self,
        idx: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
    ) -> ClassifierOutput:
        """idx: (B, T) token ids; labels: (B,) class ids; attention_mask: (B, T), 1 = real token, 0 = padding."""
        h = self.hidden_states(idx, attention_mask=attention_mask)  # (B, T, C)
        last = self.last_token_index(idx, attention_mask)  # (B,)
        pooled = h[torch.arange(idx.size(0), device=idx.device), last]  # (B, C)
        logits = self.score(pooled)  # (B, num_labels); pooling first then scoring equals transformers' order
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float(), labels.reshape(-1))
        return ClassifierOutput(logits, loss)

    def last_token_index(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) position of each row's last real token (see the class docstring for the rule)."""
        B, T = idx.shape
        if attention_mask is not None:
            real = attention_mask.to(torch.long)
        elif self.pad_token_id is not None:
            real = (idx != self.pad_token_id).to(torch.long)
        else:
            if B != 1:
                raise ValueError("a batch of several rows needs an attention_mask or a model with pad_token_id")
            return torch.full((B,), T - 1, dtype=torch.long, device=idx.device)
        positions = torch.arange(T, device=idx.device)  # (T,)
        return (positions * real).argmax(-1)  # rightmost real token; 0 for a row of padding only


# ----------------------------------------------------------------------------------------- labels and data
@dataclass(frozen=True)
class LabelSet:
    """The class names in id order: id i is names[i]."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("a classifier needs at least one label")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"label names must be distinct, got {list(self.names)}")

    @classmethod
    def from_values(cls, values: Sequence[int | str]) -> LabelSet:
        """Integer labels are class ids 0..max (named "0", "1", ...); string labels get ids in sorted order."""
        if all(isinstance(v, int) for v in values):
            return cls(tuple(str(i) for i in range(max(int(v) for v in values) + 1)))
        return cls(tuple(sorted({str(v) for v in values})))

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> LabelSet:
        """From config.json's id2label (keys are ids as strings), else num_labels generic names."""
        id2label = hf.get("id2label")
        if isinstance(id2label, dict) and id2label:
            return cls(tuple(str(id2label[str(i)]) for i in range(len(id2label))))
        return cls(tuple(f"LABEL_{i}" for i in range(int(hf.get("num_labels", 2)))))

    def __len__(self) -> int:
        return len(self.names)

    def id_of(self, label: int | str) -> int:
        if is_integer(label):
            if not 0 <= label < len(self.names):
                raise ValueError(f"label id {label} is outside 0..{len(self.names) - 1}")
            return label
        try:
            return self.names.index(str(label))
        except ValueError:
            raise ValueError(f"unknown label {label!r}; known labels: {list(self.names)}") from None

    def to_hf(self) -> dict[str, Any]:
        return {
            "id2label": {str(i): name for i, name in enumerate(self.names)},
            "label2id": {name: i for i, name in enumerate(self.names)},
        }


@dataclass(frozen=True)
class Example:
    text: str
    label: int | str
    where: str
    """file:line, for error messages."""


def read_examples(
    path: str | os.PathLike[str], *, text_field: str = "text", label_field: str = "label"
) -> list[Example]:
    """Examples from a .jsonl or .csv file. A missing text or label, a label that is neither an integer nor a
    string, labels of mixed kinds, or a CSV without the columns: ValueError naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = list(iter_jsonl_objects(path))
    elif suffix in (".csv", ".tsv"):
        rows = _csv_rows(path, "\t" if suffix == ".tsv" else ",", (text_field, label_field))
    else:
        raise ValueError(f"{path}: unknown data format {suffix!r}; use .jsonl or .csv (with a header row)")
    examples: list[Example] = []
    for where, row in rows:
        text, label = row.get(text_field), row.get(label_field)
        if not isinstance(text, str):
            raise ValueError(f"{where}: needs a string field {text_field!r}, got {text!r}")
        if label is None or label == "":
            raise ValueError(f"{where}: the label field {label_field!r} is missing")
        if isinstance(label, str) and suffix != ".jsonl" and label.strip().lstrip("-").isdigit():
            label = int(label)  # CSV cells are text: "1" is the class id 1
        if isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ValueError(f"{where}: label {label!r} must be an integer or a string")
        if examples and isinstance(label, int) != isinstance(examples[0].label, int):
            raise ValueError(
                f"{where}: label {label!r} is a {type(label).__name__} but {examples[0].where} has "
                f"{examples[0].label!r}; use integer ids everywhere or names everywhere"
            )
        examples.append(Example(text, label, where))
    if not examples:
        raise ValueError(f"{path} holds no examples")
    return examples


def _csv_rows(path: Path, delimiter: str, columns: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        header = reader.fieldnames or []
        for column in columns:
            if column not in header:
                raise ValueError(f"{path}:1: the header has no column {column!r} (columns: {header})")
        return [(f"{path}:{reader.line_num}", dict(row)) for row in reader]


def encode_texts(tokenizer: TextTokenizer, texts: Sequence[str], block_size: int) -> list[list[int]]:
    """Token ids of each text, cut to its first block_size tokens (an empty text becomes the EOT token)."""
    return [(tokenizer.encode(text) or [tokenizer.eot_token])[:block_size] for text in texts]


def pad_batch(
    rows: Sequence[Sequence[int]], pad_token_id: int, *, padding_side: str = "right"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, T), attention_mask (B, T)) for rows of different lengths, T = the longest."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    T = max(len(row) for row in rows)
    ids = torch.full((len(rows), T), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if padding_side == "right" else slice(T - len(row), T)
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


class ClassificationBatches:
    """A BatchSource of (ids (B, T), attention_mask (B, T), labels (B,)): the examples in a seeded shuffle per
    epoch, right-padded. Its state (epoch, position) continues exactly where it stopped."""

    def __init__(
        self, token_ids: Sequence[Sequence[int]], labels: Sequence[int], batch_size: int, pad_token_id: int,
        *, seed: int = 0, shuffle: bool = True,
    ) -> None:  # fmt: skip
        if len(token_ids) != len(labels) or not token_ids:
            raise ValueError(f"need as many labels as texts (and at least one), got {len(token_ids)} and {len(labels)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        self.token_ids = [list(row) for row in token_ids]
        self.labels = list(labels)
        self.batch_size = batch_size
        self.pad_token_id = pad_token_id
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.labels)))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.labels), generator=generator).tolist()

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        chosen: list[int] = []
        while len(chosen) < self.batch_size:
            order = self._order()
            take = order[self.position : self.position + self.batch_size - len(chosen)]
            chosen += take
            self.position += len(take)
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
        ids, mask = pad_batch([self.token_ids[i] for i in chosen], self.pad_token_id)
        return ids, mask, torch.tensor([self.labels[i] for i in chosen], dtype=torch.long)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])


def classification_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The Trainer's loss_fn for ClassificationBatches: mean cross-entropy of the pooled logits."""
    ids, mask, labels = batch  # (B, T), (B, T), (B,)
    loss = model(ids, labels, attention_mask=mask).loss
    assert loss is not None
    return loss


@torch.no_grad()
def accuracy(
    model: GPTForSequenceClassification, token_ids: Sequence[Sequence[int]], labels: Sequence[int],
    *, batch_size: int = 32,
) -> float:  # fmt: skip
    """Fraction of examples whose highest logit is their label (e.g. on the val split)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad = model.pad_token_id if model.pad_token_id is not None else 0
    correct = 0
    for start in range(0, len(labels), batch_size):
        ids, mask = pad_batch(token_ids[start : start + batch_size], pad)
        predicted = model(ids.to(device), attention_mask=mask.to(device)).logits.argmax(-1).cpu()
        correct += int((predicted == torch.tensor(labels[start : start + batch_size])).sum())
    model.train(was_training)
    return correct / len(labels)


def split_examples(
    examples: Sequence[Example], val_fraction: float, *, seed: int = 0
) -> tuple[list[Example], list[Example]]:
    """(train, val): a seeded shuffle, the last val_fraction of it held out (at least one example each)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    if len(examples) < 2:
        raise ValueError(f"need at least 2 examples to hold some out for validation, got {len(examples)}")
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    held_out = min(max(1, round(len(examples) * val_fraction)), len(examples) - 1)
    shuffled = [examples[i] for i in order]
    return shuffled[:-held_out], shuffled[-held_out:]


def accuracy_evaluation(
    token_ids: Sequence[Sequence[int]], labels: Sequence[int], *, batch_size: int = 32
) -> Callable[[nn.Module, int], dict[str, Any]]:
    """An evaluation for the Trainer's `evaluations`: writes val_accuracy to metrics.jsonl at every evaluation."""

    def evaluate(model: nn.Module, step: int) -> dict[str, Any]:
        assert isinstance(model, GPTForSequenceClassification)
        return {"val_accuracy": accuracy(model, token_ids, labels, batch_size=batch_size)}

    return evaluate


# ------------------------------------------------------------------------------------------ files
def save_classifier(model: GPTForSequenceClassification, directory: str | os.PathLike[str], labels: LabelSet) -> None:
    """config.json + model.safetensors that transformers.GPT2ForSequenceClassification.from_pretrained reads."""
    from safetensors.torch import save

    if len(labels) != model.num_labels:
        raise ValueError(f"{len(labels)} label names for a model with {model.num_labels} labels")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t for name, t in hf_state_dict(model).items() if name != "score.bias"}
    hf = config_to_hf(model.config) | labels.to_hf()
    hf.update(architectures=[ARCHITECTURE], num_labels=model.num_labels, pad_token_id=model.pad_token_id,
              problem_type="single_label_classification")  # fmt: skip
    atomic_write_bytes(directory / "model.safetensors", save(tensors, metadata={"format": "pt"}))
    atomic_write_bytes(directory / "config.json", (json.dumps(hf, indent=2) + "\n").encode())


def load_classifier(directory: str | os.PathLike[str]) -> tuple[GPTForSequenceClassification, LabelSet]:
    """A classifier and its labels from a directory save_classifier or transformers wrote."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} is not a classifier directory: it has no config.json")
    try:
        hf = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    labels = LabelSet.from_hf(hf)
    tensors = read_hf_state_dict(directory)
    score = tensors.pop(SCORE_WEIGHT, None)
    if score is None:
        raise ValueError(f"{directory} has no {SCORE_WEIGHT}: it is not a sequence classifier (architectures "
                         f"{hf.get('architectures')}); fine-tune one with a classification head first")  # fmt: skip
    if score.shape[0] != len(labels):
        raise ValueError(f"{SCORE_WEIGHT} has {score.shape[0]} rows but config.json names {len(labels)} labels")
    try:
        config = config_from_hf(hf)
    except ValueError as err:
        raise ValueError(f"{config_path}: {err}") from err
    backbone = empty_model(config)  # every tensor is overwritten next
    load_hf_state_dict(backbone, tensors)
    model = GPTForSequenceClassification(config, len(labels), pad_token_id=hf.get("pad_token_id"))
    model.load_state_dict({**backbone.state_dict(), SCORE_WEIGHT: score})
    return model.eval(), labels


# ---------------------------------------------------------------------------------------- prediction
@dataclass(frozen=True)
class Prediction:
    text: str
    label: str
    probability: float


@torch.no_grad()
def predict(
    model: GPTForSequenceClassification, tokenizer: TextTokenizer, labels: LabelSet, texts: Sequence[str],
    *, batch_size: int = 32,
) -> list[Prediction]:  # fmt: skip
    """The most probable label of each text, with its softmax probability."""
    device = next(model.parameters()).device
    pad = model.pad_token_id if model.pad_token_id is not None else tokenizer.eot_token
    rows = encode_texts(tokenizer, texts, model.config.block_size)
    out: list[Prediction] = []
    for start in range(0, len(rows), batch_size):
        ids, mask = pad_batch(rows[start : start + batch_size], pad)
        probs = model(ids.to(device), attention_mask=mask.to(device)).logits.float().softmax(-1).cpu()
        for text, p in zip(texts[start : start + batch_size], probs, strict=True):
            best = int(p.argmax())
            out.append(Prediction(text, labels.names[best], float(p[best])))
    return out


def classify_texts(model_dir: str | os.PathLike[str], texts: Sequence[str]) -> list[Prediction]:
    """`gpt2 classify`: load the classifier and the tokenizer saved beside it, predict each text."""
    if not texts:
        raise ValueError("give at least one text to classify")
    model, labels = load_classifier(model_dir)
    return predict(model, load_tokenizer(model_dir), labels, texts)
