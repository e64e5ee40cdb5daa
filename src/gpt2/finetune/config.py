"""The fine-tuning configuration: what is particular to fine-tuning (the pretrained model, the data and its
format, the task, LoRA, the memory plan, early stopping) plus `train`, a whole `TrainConfig` for the optimizer,
schedule, evaluation, checkpoints, tracking and device, with fine-tuning's defaults.

    >>> FinetuneConfig.from_overrides(data="notes.txt", max_steps=50).train.schedule.max_steps
    50
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpt2.finetune.lora import LoRAConfig
from gpt2.train.config import TrainConfig, parse_override, parse_overrides, parse_value

FULL_LEARNING_RATE = 1e-4
LORA_LEARNING_RATE = 1e-3
TASKS = ("lm", "classification")
AUTO = "auto"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip

FINETUNE_TRAINING = TrainConfig.from_dict(dict(
    max_steps=200, learning_rate=FULL_LEARNING_RATE, warmup_steps=10, weight_decay=0.0, eval_interval=20,
    checkpoint_interval=100, out_dir="out/finetune", sample_prompt="", sample_tokens=100,
))  # fmt: skip
"""Fine-tuning's training defaults. Its data, tokenizer and model-shape fields are not used: the data is
FinetuneConfig.data, the model and tokenizer are FinetuneConfig.model's; block_size and dropout apply."""


@dataclass(frozen=True)
class FinetuneConfig:
    """A fine-tuning run; every field, and every field of `train`, is settable with `--set KEY=VALUE` (a
    training key by its own name, e.g. max_steps=500, or as train.max_steps=500)."""

    model: str = "gpt2"
    """HF directory or Hub name of the pretrained model (its tokenizer is loaded from the same place)."""
    data: str = ""
    """Text file or folder, .jsonl (text, prompt/completion or chat records) or .csv (see text_column); for
    task=classification a .jsonl or .csv file of text + label records (see text_field / label_field)."""
    task: str = "lm"
    """lm (next-token fine-tuning) or classification (a sequence classifier with a score head)."""
    label_field: str = "label"
    """task=classification: the JSONL field or CSV column holding the label (an integer id or a name)."""
    text_column: str | None = None
    """The CSV column holding the text."""
    text_field: str = "text"
    """The JSONL field holding the text of plain-text records (task=classification: the JSONL field or CSV
    column holding the text)."""
    lora: bool = False
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.05
    lora_targets: str = "c_attn"
    """Comma-separated layers to adapt: c_attn, c_proj, c_fc."""
    batch_size: int | str = 8
    """Sequences per micro-batch, or "auto": the largest that fits memory_budget, with grad_accum_steps chosen so
    that batch_size * grad_accum_steps == global_batch_size."""
    global_batch_size: int | None = None
    """batch_size=auto: sequences per optimizer step (default 8 * grad_accum_steps)."""
    memory_budget: str | None = None
    """Bytes the run may use, e.g. "16GiB" or "500MB" (default: 0.9 x free RAM on CPU, free GPU memory on CUDA)."""
    learning_rate: float | None = None
    """Peak LR; default 1e-4 (full) or 1e-3 (LoRA)."""
    patience: int | None = None
    """Stop after this many evaluations without a lower val loss (None: never stop early)."""
    train: TrainConfig = FINETUNE_TRAINING
    """Optimizer, schedule, evaluation (eval_interval 0 = only at the start and the end), checkpoints, tracking
    (log_to), sample, device, dtype, seed; block_size (default min(the model's context, 1024)) and dropout
    (default: the model's)."""

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):  # from parsed overrides: fine-tuning's defaults, then the given keys
            object.__setattr__(self, "train", FINETUNE_TRAINING.replace(**self.train))
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if isinstance(self.batch_size, str) and self.batch_size != AUTO:
            raise ValueError(f"batch_size must be a positive integer or {AUTO!r}, got {self.batch_size!r}")
        for name in ("batch_size", "global_batch_size"):
            value = getattr(self, name)
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if self.memory_budget is not None:
            parse_bytes(self.memory_budget)
        if self.task == "classification" and self.lora:
            raise ValueError("task=classification trains every weight and the score head; drop --lora")
        if self.task == "classification" and self.train.data.val_fraction == 0.0:
            raise ValueError("task=classification needs a val split for its accuracy: set val_fraction > 0")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"patience must be a positive integer or unset, got {self.patience}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        self.lora_config()  # validates the LoRA settings

    @classmethod
    def from_overrides(cls, **values: Any) -> FinetuneConfig:
        """A config from values, given by the name of a fine-tuning field or of a training field (text is read
        as the field's type, as `--set` reads it). Unknown keys are an error listing the valid ones."""
        own = {field.name for field in dataclasses.fields(cls)} - {"train"}
        hints = typing.get_type_hints(cls)
        train_hints = TrainConfig.key_hints()
        parsed: dict[str, Any] = {}
        train: dict[str, Any] = {}
        for key, value in values.items():
            if key in own:
                parsed[key] = parse_value(key, value, hints[key]) if isinstance(value, str) else value
            elif key in train_hints:
                train[key] = parse_value(key, value, train_hints[key]) if isinstance(value, str) else value
            else:
                raise ValueError(f"unknown fine-tuning setting {key!r}; valid: {', '.join(_valid_keys())}")
        return cls(**parsed, train=FINETUNE_TRAINING.replace(**train))

    @classmethod
    def from_settings(cls, assignments: Sequence[str], **values: Any) -> FinetuneConfig:
        """A config from `--set KEY=VALUE` assignments (read by the one `--set` parser, `parse_overrides`) and
        then `values`; a training key may be written bare (max_steps=5) or dotted (train.max_steps=5)."""
        own = {field.name for field in dataclasses.fields(cls)}
        dotted = []
        unknown = [key for key, _ in map(parse_override, assignments)
                   if key.partition(".")[0] not in own and key not in TrainConfig.key_hints()]  # fmt: skip
        if unknown:
            raise ValueError(f"unknown fine-tuning key(s) {unknown}; valid keys: {', '.join(_valid_keys())}")
        for assignment in assignments:
            key, raw = parse_override(assignment)
            in_train = key not in own and key in TrainConfig.key_hints()
            dotted.append(f"train.{key}={raw}" if in_train else f"{key}={raw}")
        parsed = parse_overrides(cls, dotted, what="fine-tuning")
        train = {**parsed.pop("train", {}), **{k: v for k, v in values.items() if k not in own}}
        return cls.from_overrides(**parsed, **{k: v for k, v in values.items() if k in own}, **train)

    @property
    def out_dir(self) -> str:
        return self.train.output.out_dir

    def lora_config(self) -> LoRAConfig:
        targets = tuple(name.strip() for name in self.lora_targets.split(",") if name.strip())
        return LoRAConfig(rank=self.lora_rank, alpha=self.lora_alpha, dropout=self.lora_dropout, target_modules=targets)

    def training(self, block_size: int, eval_batches: int, batch_size: int, grad_accum_steps: int) -> TrainConfig:
        """The Trainer's config: `train` with the run's block size, memory plan (batch_size, grad_accum_steps),
        the LR for full or LoRA fine-tuning, and eval_interval=0 read as "at the start and the end"."""
        lr = self.learning_rate or (LORA_LEARNING_RATE if self.lora else FULL_LEARNING_RATE)
        train = self.train
        return train.replace(
            block_size=block_size, eval_batches=eval_batches, batch_size=batch_size, grad_accum_steps=grad_accum_steps,
            learning_rate=lr, warmup_steps=min(train.schedule.warmup_steps, train.schedule.max_steps),
            eval_interval=train.evaluation.eval_interval or train.schedule.max_steps,
        )  # fmt: skip


def _valid_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(FinetuneConfig) if f.name != "train"] + TrainConfig.field_names()


def parse_bytes(text: str) -> int:
    """A size like "16GiB", "500MB" or "1073741824" in bytes (binary units KiB..TiB, decimal KB..TB).

    >>> parse_bytes("1.5GiB"), parse_bytes("500MB")
    (1610612736, 500000000)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"memory_budget={text!r} is not a size; write it like 16GiB, 512MiB or 8GB")
    return int(float(match.group(1)) * _UNITS[unit])
