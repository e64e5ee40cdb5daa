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
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass

from gpt2.finetune.lora import LoRAConfig
from gpt2.train.config import (
    ConfigError,
    Flag,
    Integer,
    Number,
    TrainConfig,
    parse_override,
    parse_overrides,
    parse_value,
    problems,
    unknown_key,
)

FULL_LEARNING_RATE = 1e-4
LORA_LEARNING_RATE = 1e-3
AUTO = "auto"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip

FINETUNE_TRAINING = TrainConfig.from_dict({
    "optimizer": dict(learning_rate=FULL_LEARNING_RATE, weight_decay=0.0),
    "schedule": dict(max_steps=200, warmup_steps=10),
    "evaluation": dict(eval_interval=20, sample_prompt="", sample_tokens=100),
    "output": dict(checkpoint_interval=100, out_dir="out/finetune"),
})  # fmt: skip
"""Fine-tuning's training defaults. Its data, tokenizer and model-shape fields are not used: the data is
FinetuneConfig.data, the model and tokenizer are FinetuneConfig.model's; block_size and dropout apply."""


@dataclass(frozen=True, config=ConfigDict(extra="forbid", allow_inf_nan=False))
class FinetuneConfig:
    """A fine-tuning run, checked at construction from its annotations and bounds; every field, and every field
    of `train`, is settable with `--set KEY=VALUE` (a training key as `section.field`, by its flat alias, e.g.
    max_steps=500, or as train.max_steps=500)."""

    model: str = "gpt2"
    """HF directory or Hub name of the pretrained model (its tokenizer is loaded from the same place)."""
    data: str = ""
    """Text file or folder, .jsonl (text, prompt/completion or chat records) or .csv (see text_column); for
    task=classification a .jsonl or .csv file of text + label records (see text_field / label_field)."""
    task: Literal["lm", "classification"] = "lm"
    """lm (next-token fine-tuning) or classification (a sequence classifier with a score head)."""
    label_field: str = "label"
    """task=classification: the JSONL field or CSV column holding the label (an integer id or a name)."""
    text_column: str | None = None
    """The CSV column holding the text."""
    text_field: str = "text"
    """The JSONL field holding the text of plain-text records (task=classification: the JSONL field or CSV
    column holding the text)."""
    lora: Flag = False
    lora_rank: Integer = Field(default=8, ge=1)
    lora_alpha: Number = 16.0
    lora_dropout: Number = Field(default=0.05, ge=0.0, lt=1.0)
    lora_targets: str = "c_attn"
    """Comma-separated layers to adapt: c_attn, c_proj, c_fc."""
    batch_size: Annotated[Integer, Field(ge=1)] | Literal["auto"] = 8
    """Sequences per micro-batch, or "auto": the largest that fits memory_budget, with grad_accum_steps chosen so
    that batch_size * grad_accum_steps == global_batch_size."""
    global_batch_size: Integer | None = Field(default=None, ge=1)
    """batch_size=auto: sequences per optimizer step (default 8 * grad_accum_steps)."""
    memory_budget: str | None = None
    """Bytes the run may use, e.g. "16GiB" or "500MB" (default: 0.9 x free RAM on CPU, free GPU memory on CUDA)."""
    learning_rate: Number | None = Field(default=None, gt=0.0)
    """Peak LR; default 1e-4 (full) or 1e-3 (LoRA)."""
    patience: Integer | None = Field(default=None, ge=1)
    """Stop after this many evaluations without a lower val loss (None: never stop early)."""
    train: TrainConfig = FINETUNE_TRAINING
    """Optimizer, schedule, evaluation (eval_interval 0 = only at the start and the end), checkpoints, tracking
    (log_to), sample, device, dtype, seed; block_size (default min(the model's context, 1024)) and dropout
    (default: the model's)."""

    @field_validator("memory_budget")
    @classmethod
    def _a_size(cls, text: str | None) -> str | None:
        try:
            if text is not None:
                parse_bytes(text)
        except ValueError:
            raise ValueError("must be a size: write it like 16GiB, 512MiB or 8GB") from None
        return text

    @model_validator(mode="after")
    def _consistent(self) -> FinetuneConfig:
        if self.task == "classification" and self.lora:
            raise ValueError("task=classification trains every weight and the score head; drop --lora")
        if self.task == "classification" and self.train.data.val_fraction == 0.0:
            raise ValueError("task=classification needs a val split for its accuracy: set data.val_fraction > 0")
        self.lora_config()  # validates the LoRA settings
        return self

    @classmethod
    def from_overrides(cls, **values: Any) -> FinetuneConfig:
        """A config from values, given by the name of a fine-tuning field or by a training key (text is read as
        the field's type, as `--set` reads it). A ConfigError names every unknown key and every bad value."""
        own = {field.name for field in dataclasses.fields(cls)} - {"train"}
        hints, train_hints = typing.get_type_hints(cls), TrainConfig.key_hints()
        unknown = [key for key in values if key not in own and key not in train_hints]
        if unknown:
            raise ConfigError([unknown_key(key, "fine-tuning", sorted(own)) for key in unknown])
        read = {
            key: parse_value(value, hints[key] if key in own else train_hints[key]) if isinstance(value, str) else value
            for key, value in values.items()
        }
        train_problems: list[str] = []
        try:
            train = FINETUNE_TRAINING.replace(**{key: value for key, value in read.items() if key not in own})
        except ConfigError as err:  # reported with the fine-tuning fields' problems
            train, train_problems = FINETUNE_TRAINING, err.problems
        try:
            config = cls(**{key: value for key, value in read.items() if key in own}, train=train)
        except ValidationError as err:
            raise ConfigError([*problems(err, cls).problems, *train_problems]) from None
        if train_problems:
            raise ConfigError(train_problems)
        return config

    @classmethod
    def from_settings(cls, assignments: Sequence[str], **values: Any) -> FinetuneConfig:
        """A config from `--set KEY=VALUE` assignments (read by the one `--set` parser, `parse_overrides`) and
        then `values`; a training key may be written as `section.field`, by its flat alias (max_steps=5) or
        under train (train.schedule.max_steps=5)."""
        own = {field.name for field in dataclasses.fields(cls)}
        dotted = []
        unknown = [key for key, _ in map(parse_override, assignments)
                   if key.partition(".")[0] not in own and key not in TrainConfig.key_hints()]  # fmt: skip
        if unknown:
            raise ConfigError([unknown_key(key, "fine-tuning", sorted(own - {"train"})) for key in unknown])
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
