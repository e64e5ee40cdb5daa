"""A fine-tuning run: a pretrained model and ITS tokenizer, a data file, the Trainer's step, keep the best.

`finetune(config)` loads the model (HF directory or Hub name) with the tokenizer stored beside it, reads and
tokenizes the data (see `gpt2.finetune.data`), splits off a val set, trains with the Trainer (full weights, or
LoRA adapters only), evaluates every eval_interval steps, keeps the weights with the lowest val loss and
optionally stops early. Everything is checked before anything is written: a bad file or setting leaves out_dir
untouched. The result in out_dir is a normal HF-format model + tokenizer (+ chat_template.json), with
metrics.jsonl, loss.png, sample.txt, and for LoRA adapter/ in PEFT's format; checkpoints/last resumes exactly.

task="classification" trains `GPTForSequenceClassification` (the pretrained backbone plus a new `score` head,
N(0, 0.02)) on JSONL/CSV text + label records, reports val accuracy at each evaluation and writes the classifier
in transformers' GPT2ForSequenceClassification layout (config.json with id2label / label2id) + the tokenizer.

Before anything is written the run's memory is estimated (`gpt2.finetune.memory`) and checked against
memory_budget (default: 0.9 x the free memory of the device); batch_size=auto picks the largest micro-batch that
fits and the gradient accumulation that keeps the global batch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

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
from gpt2.finetune.data import RowBatches, Rows, load_examples, make_rows, split_rows
from gpt2.finetune.lora import LoRAConfig, add_lora, lora_state_dict, merge_lora, save_adapter
from gpt2.finetune.memory import GIB, MemoryEstimate, auto_batch_size, check_fits, estimate_memory
from gpt2.model import GPT, CausalSelfAttention
from gpt2.runtime.device import resolve_device, resolve_dtype
from gpt2.tokenizer.chat import save_chat_template
from gpt2.train.config import TrainConfig
from gpt2.train.metrics import METRICS_FILE, PLOT_FILE
from gpt2.train.optimizer import configure_optimizer
from gpt2.train.pretrain import sample_text
from gpt2.train.trainer import Trainer
from gpt2.weights import save_pretrained

FULL_LEARNING_RATE = 1e-4
LORA_LEARNING_RATE = 1e-3
CHECKPOINT_DIR = "checkpoints"
ADAPTER_DIR = "adapter"
SAMPLE_FILE = "sample.txt"
VAL_SEED_OFFSET = 1_000_003  # the val batches never share the train stream's order
TASKS = ("lm", "classification")
AUTO = "auto"
DEFAULT_BUDGET_FRACTION = 0.9  # of the device's free memory, when memory_budget is not set
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


@dataclass(frozen=True)
class FinetuneConfig:
    """A fine-tuning run; every field is settable with `--set KEY=VALUE`."""

    model: str = "gpt2"
    """HF directory or Hub name of the pretrained model (its tokenizer is loaded from the same place)."""
    data: str = ""
    """Text file or folder, .jsonl (text, prompt/completion or chat records) or .csv (see text_column); for
    task=classification a .jsonl or .csv file of text + label records (see text_field / label_field)."""
    task: str = "lm"
    """lm (next-token fine-tuning) or classification (a sequence classifier with a score head)."""
    label_field: str = "label"
    """task=classification: the JSONL field or CSV column holding the label (an integer id or a name)."""
    out_dir: str = "out/finetune"
    text_column: str | None = None
    """The CSV column holding the text."""
    text_field: str = "text"
    """The JSONL field holding the text of plain-text records (task=classification: the JSONL field or CSV
    column holding the text)."""
    block_size: int | None = None
    """Tokens per row; default min(the model's context, 1024). Never more than the model's context."""
    dropout: float | None = None
    """Dropout while fine-tuning (None keeps the model's)."""
    lora: bool = False
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.05
    lora_targets: str = "c_attn"
    """Comma-separated layers to adapt: c_attn, c_proj, c_fc."""
    batch_size: int | str = 8
    """Sequences per micro-batch, or "auto": the largest that fits memory_budget, with grad_accum_steps chosen so
    that batch_size * grad_accum_steps == global_batch_size."""
    grad_accum_steps: int = 1
    global_batch_size: int | None = None
    """batch_size=auto: sequences per optimizer step (default 8 * grad_accum_steps)."""
    memory_budget: str | None = None
    """Bytes the run may use, e.g. "16GiB" or "500MB" (default: 0.9 x free RAM on CPU, free GPU memory on CUDA)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them (less memory, ~30% more compute)."""
    max_steps: int = 200
    learning_rate: float | None = None
    """Peak LR; default 1e-4 (full) or 1e-3 (LoRA)."""
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    val_fraction: float = 0.1
    eval_interval: int = 20
    """Evaluate (and keep the best weights) every this many steps and at the end; 0 = only at the end."""
    patience: int | None = None
    """Stop after this many evaluations without a lower val loss (None: never stop early)."""
    checkpoint_interval: int = 100
    """Save checkpoints/last every this many steps (and at the end); 0 = only at the end."""
    sample_prompt: str = ""
    sample_tokens: int = 100
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 1337

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if isinstance(self.batch_size, str) and self.batch_size != AUTO:
            raise ValueError(f"batch_size must be a positive integer or {AUTO!r}, got {self.batch_size!r}")
        for name in ("batch_size", "grad_accum_steps", "max_steps", "global_batch_size"):
            value = getattr(self, name)
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if self.memory_budget is not None:
            parse_bytes(self.memory_budget)
        if self.task == "classification" and self.lora:
            raise ValueError("task=classification trains every weight and the score head; drop --lora")
        if self.task == "classification" and self.val_fraction == 0.0:
            raise ValueError("task=classification needs a val split for its accuracy: set val_fraction > 0")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"patience must be a positive integer or unset, got {self.patience}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size}")
        self.lora_config()  # validates the LoRA settings

    @classmethod
    def from_overrides(cls, **values: Any) -> FinetuneConfig:
        """A config from strings or values; unknown keys are an error listing the valid ones."""
        names = {field.name: field for field in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        parsed = {}
        for key, value in values.items():
            if key not in names:
                raise ValueError(f"unknown fine-tuning setting {key!r}; valid: {', '.join(names)}")
            parsed[key] = _parse(key, value, hints[key]) if isinstance(value, str) else value
        return cls(**parsed)

    def lora_config(self) -> LoRAConfig:
        targets = tuple(name.strip() for name in self.lora_targets.split(",") if name.strip())
        return LoRAConfig(rank=self.lora_rank, alpha=self.lora_alpha, dropout=self.lora_dropout, target_modules=targets)

    def train_config(
        self, block_size: int, eval_batches: int, batch_size: int | None = None, grad_accum_steps: int | None = None
    ) -> TrainConfig:
        """The Trainer's view of this run (batch_size / grad_accum_steps: the plan for batch_size=auto)."""
        lr = self.learning_rate or (LORA_LEARNING_RATE if self.lora else FULL_LEARNING_RATE)
        return TrainConfig(
            data=self.data or "-", tokenizer="bytes", block_size=block_size,
            batch_size=batch_size or int(self.batch_size),
            grad_accum_steps=grad_accum_steps or self.grad_accum_steps, max_steps=self.max_steps, learning_rate=lr,
            min_lr_ratio=self.min_lr_ratio, warmup_steps=min(self.warmup_steps, self.max_steps),
            weight_decay=self.weight_decay, grad_clip=self.grad_clip, eval_interval=self.eval_interval,
            eval_batches=eval_batches, checkpoint_interval=self.checkpoint_interval, out_dir=self.out_dir,
            sample_prompt=self.sample_prompt, sample_tokens=self.sample_tokens, device=self.device,
            dtype=self.dtype, seed=self.seed,  # type: ignore[arg-type]
        )  # fmt: skip


def _parse(key: str, value: str, hint: Any) -> Any:
    options = typing.get_args(hint) or (hint,)
    if value.lower() in ("none", "null") and type(None) in options:
        return None
    for kind in options:
        try:
            if kind is bool:
                if value.lower() in ("true", "1", "yes", "false", "0", "no"):
                    return value.lower() in ("true", "1", "yes")
                continue
            if kind in (int, float, str):
                return kind(value)
        except ValueError:
            continue
    raise ValueError(f"setting {key}={value!r} is not a {hint}")


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


def available_memory(device: torch.device) -> int:
    """Bytes free for this run now: free CUDA memory, else MemAvailable of /proc/meminfo (else all of RAM)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def memory_budget(config: FinetuneConfig, device: torch.device) -> int:
    if config.memory_budget is not None:
        return parse_bytes(config.memory_budget)
    return int(DEFAULT_BUDGET_FRACTION * available_memory(device))


@dataclass(frozen=True)
class MemoryPlan:
    batch_size: int
    grad_accum_steps: int
    lines: list[str]
    """The estimate with and without activation checkpointing, and the budget, for the log."""


def plan_memory(config: FinetuneConfig, model: GPT, block_size: int, device: torch.device) -> MemoryPlan:
    """The micro-batch and accumulation of the run, checked against the memory budget (ValueError when the run
    cannot fit: nothing has been written yet)."""
    budget = memory_budget(config, device)
    dtype = resolve_dtype(config.dtype, device)  # type: ignore[arg-type]
    lora_params = sum(t.numel() for t in lora_state_dict(model).values()) if config.lora else None
    checkpointing = config.activation_checkpointing
    if config.batch_size == AUTO:
        global_batch = config.global_batch_size or 8 * config.grad_accum_steps
        plan = auto_batch_size(model.config, block_size, budget, global_batch_size=global_batch, dtype=dtype,
                               lora_params=lora_params, activation_checkpointing=checkpointing)  # fmt: skip
        batch_size, grad_accum_steps = plan.batch_size, plan.grad_accum_steps
    else:
        batch_size, grad_accum_steps = int(config.batch_size), config.grad_accum_steps

    def estimate(checkpointed: bool) -> MemoryEstimate:
        return estimate_memory(model.config, batch_size, block_size, dtype=dtype, lora_params=lora_params,
                               activation_checkpointing=checkpointed)  # fmt: skip

    chosen = estimate(checkpointing)
    lines = [
        f"memory estimate: {estimate(False).describe()}",
        f"memory estimate with activation checkpointing: {estimate(True).describe()}",
        f"memory budget {budget / GIB:.2f} GiB; batch_size {batch_size} x grad_accum_steps {grad_accum_steps}"
        + (" (batch_size=auto)" if config.batch_size == AUTO else ""),
    ]
    check_fits(chosen, budget)
    return MemoryPlan(batch_size, grad_accum_steps, lines)


@dataclass
class FinetuneResult:
    out_dir: Path
    step: int
    best_step: int
    best_val_loss: float
    first_val_loss: float
    stopped_early: bool
    notes: list[str]
    sample: str | None = None
    best_val_accuracy: float | None = None
    """task=classification: the val accuracy of the output (best) weights."""
    batch_size: int = 0
    grad_accum_steps: int = 0


def prepare(config: FinetuneConfig) -> tuple[LLM, Rows, Rows, int, list[str]]:
    """Load the model and its tokenizer and the data, and check them all (nothing is written)."""
    if not config.data:
        raise ValueError("no data: pass --data FILE_OR_FOLDER")
    llm = LLM.load(config.model, device=resolve_device(config.device))
    block_size = _block_size(config, llm.model)
    examples = load_examples(config.data, llm.tokenizer, column=config.text_column, text_field=config.text_field)
    rows = make_rows(examples, block_size, pad_id=llm.tokenizer.eot_token)
    train_rows, val_rows = split_rows(rows, config.val_fraction, config.seed)
    if len(train_rows) == 0:
        raise ValueError(f"{config.data} gives {len(rows)} rows, none left to train on; give more data")
    return llm, train_rows, val_rows, block_size, rows.notes


def _block_size(config: FinetuneConfig, model: GPT) -> int:
    context = model.config.block_size
    block_size = config.block_size or min(context, 1024)
    if block_size > context:
        raise ValueError(
            f"block_size={block_size} is larger than the model's context of {context} tokens; set block_size<={context}"
        )
    return block_size


@dataclass
class ClassificationData:
    labels: LabelSet
    train_ids: list[list[int]]
    train_labels: list[int]
    val_ids: list[list[int]]
    val_labels: list[int]
    block_size: int
    """The longest (cut) text: what a micro-batch's rows are padded to at most."""


def prepare_classification(config: FinetuneConfig) -> tuple[LLM, GPTForSequenceClassification, ClassificationData]:
    """The pretrained model turned into a classifier (score head N(0, 0.02), seeded) and the split, encoded
    examples; everything checked, nothing written."""
    if not config.data:
        raise ValueError("no data: pass --data FILE (.jsonl or .csv with text and label)")
    llm = LLM.load(config.model, device=resolve_device(config.device))
    block_size = _block_size(config, llm.model)
    examples = read_examples(config.data, text_field=config.text_field, label_field=config.label_field)
    labels = LabelSet.from_values([e.label for e in examples])
    if len(labels) < 2:
        raise ValueError(f"{config.data}: every example has the label {labels.names[0]!r}; a classifier needs two")
    train, val = split_examples(examples, config.val_fraction, seed=config.seed)
    tokenizer = llm.tokenizer
    train_ids = encode_texts(tokenizer, [e.text for e in train], block_size)
    val_ids = encode_texts(tokenizer, [e.text for e in val], block_size)
    torch.manual_seed(config.seed)  # the score head's initialization
    model = GPTForSequenceClassification(llm.model.config, len(labels), pad_token_id=tokenizer.eot_token)
    result = model.load_state_dict(llm.model.state_dict(), strict=False)
    assert not result.unexpected_keys and list(result.missing_keys) == ["score.weight"], result
    model.to(llm.device)
    data = ClassificationData(
        labels, train_ids, [labels.id_of(e.label) for e in train], val_ids, [labels.id_of(e.label) for e in val],
        max(len(row) for row in train_ids + val_ids),
    )  # fmt: skip
    return llm, model, data


def _set_dropout(model: GPT, dropout: float) -> None:
    model.config = dataclasses.replace(model.config, dropout=dropout)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = dropout
        elif isinstance(module, CausalSelfAttention):
            module.dropout = dropout  # the attention weights' dropout probability


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (all for a full fine-tune, the adapters for LoRA), by name."""
    return {name: p.detach().clone().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def finetune(
    config: FinetuneConfig,
    *,
    resume: bool = False,
    stop_at_step: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> FinetuneResult:
    """Fine-tune as `config` says (see the module docstring). resume: continue from out_dir/checkpoints/last.
    stop_at_step: save and return after this step although the LR schedule runs to max_steps."""
    from tqdm.auto import tqdm

    say = log or (lambda message: None)
    out = Path(config.out_dir)
    last = out / CHECKPOINT_DIR / "last"
    if resume and not (last / "state.pt").is_file():
        raise FileNotFoundError(f"--resume: no checkpoint in {last}; start without --resume")
    if not resume and out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; pass --resume to continue the run there, or another --out")
    classifying = config.task == "classification"
    notes: list[str] = []
    model: GPT
    if classifying:
        llm, model, data = prepare_classification(config)
        block_size = data.block_size
        val_count = len(data.val_labels)
        train_count = len(data.train_labels)
    else:
        llm, train_rows, val_rows, block_size, notes = prepare(config)
        model, val_count, train_count = llm.model, len(val_rows), len(train_rows)
    for note in notes:
        say(note)
    tokenizer, device = llm.tokenizer, llm.device
    saved_dropout = model.config.dropout  # the output model keeps the dropout it came with
    if config.dropout is not None:
        _set_dropout(model, config.dropout)
    if config.lora:
        add_lora(model, config.lora_config())
    plan = plan_memory(config, model, block_size, device)  # refuses a run that cannot fit, before any write
    for line in plan.lines:
        say(line)
    model.activation_checkpointing = config.activation_checkpointing
    B = plan.batch_size
    eval_batches = max(1, math.ceil(val_count / B))
    train_config = config.train_config(block_size, eval_batches, B, plan.grad_accum_steps)
    torch.manual_seed(config.seed)
    if classifying:
        pad = tokenizer.eot_token
        batches: Any = ClassificationBatches(data.train_ids, data.train_labels, B, pad, seed=config.seed)
        val_source: Any = lambda: ClassificationBatches(data.val_ids, data.val_labels, B, pad, shuffle=False)  # noqa: E731
        loss_fn: Any = classification_loss
    else:
        batches = RowBatches(train_rows, B, seed=config.seed)
        val_source = (lambda: RowBatches(val_rows, B, seed=config.seed + VAL_SEED_OFFSET)) if len(val_rows) else None
        loss_fn = None
    trainer = Trainer(
        model, configure_optimizer(model, train_config, device), train_config, batches,
        **({"loss_fn": loss_fn} if loss_fn is not None else {}),
        val_batches=val_source, tokenizer=tokenizer, device=device, log=say,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    progress_state: dict[str, Any] = {"best_val_loss": math.inf, "best_step": 0, "first_val_loss": math.nan,
                                      "bad_evals": 0, "best_val_accuracy": None}  # fmt: skip
    if resume:
        model.load_state_dict(load_file(str(last / "trainable.safetensors"), device=str(device)), strict=False)
        trainer.load_state_dict(torch.load(last / "state.pt", weights_only=True, map_location=device))
        progress_state = json.loads((last / "progress.json").read_text(encoding="utf-8"))
        trainer.metrics.start(resume_step=trainer.step)
    else:
        trainer.metrics.start()
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    resuming = f"; resuming at step {trainer.step}" if resume else ""
    unit = f"texts of up to {block_size} tokens" if classifying else f"rows of {block_size} tokens"
    say(f"fine-tuning {trained:,} of {model.num_parameters():,} parameters on {device}: {train_count} train / "
        f"{val_count} val {unit}{resuming}")  # fmt: skip

    def evaluate() -> None:
        if trainer.val_batches is None:  # no val split: the last weights are the best
            progress_state.update(best_step=trainer.step)
            save_file(trainable_state(model), str(out / CHECKPOINT_DIR / "best.safetensors"))
            return
        val_loss = trainer.evaluate()
        record: dict[str, Any] = {"step": trainer.step, "val_loss": val_loss}
        if classifying:
            record |= val_accuracy(model, trainer.step)
        trainer.metrics.write(record)
        if math.isnan(progress_state["first_val_loss"]):
            progress_state["first_val_loss"] = val_loss
        if val_loss < progress_state["best_val_loss"]:
            progress_state.update(best_val_loss=val_loss, best_step=trainer.step, bad_evals=0,
                                  best_val_accuracy=record.get("val_accuracy"))  # fmt: skip
            save_file(trainable_state(model), str(out / CHECKPOINT_DIR / "best.safetensors"))
        else:
            progress_state["bad_evals"] += 1
        acc = f", accuracy {record['val_accuracy']:.3f}" if classifying else ""
        say(f"step {trainer.step}: val loss {val_loss:.4f}{acc} (best {progress_state['best_val_loss']:.4f} at step "
            f"{progress_state['best_step']})")  # fmt: skip

    def save_last() -> None:
        staging = out / CHECKPOINT_DIR / "last.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_file(trainable_state(model), str(staging / "trainable.safetensors"))
        torch.save(trainer.state_dict(), staging / "state.pt")
        (staging / "progress.json").write_text(json.dumps(progress_state), encoding="utf-8")
        shutil.rmtree(last, ignore_errors=True)
        os.replace(staging, last)

    if classifying:
        val_accuracy = accuracy_evaluation(data.val_ids, data.val_labels, batch_size=B)
    (out / CHECKPOINT_DIR).mkdir(exist_ok=True)
    model.train()  # LLM.load gives an inference-mode model: dropout must be on while training
    stopped_early = False
    with tqdm(total=config.max_steps, initial=trainer.step, unit="step", disable=not progress) as bar:
        if trainer.step == 0:
            evaluate()
        end_step = config.max_steps if stop_at_step is None else min(stop_at_step, config.max_steps)
        while trainer.step < end_step:
            stats = trainer.train_step()
            bar.set_postfix_str(f"loss {stats.loss:.4f} lr {stats.lr:.2e} {stats.tokens_per_second:,.0f} tok/s")
            bar.update(1)
            at_end = trainer.step == config.max_steps
            if at_end or (config.eval_interval and trainer.step % config.eval_interval == 0):
                evaluate()
                trainer.metrics.plot(out / PLOT_FILE)
                if config.patience is not None and progress_state["bad_evals"] >= config.patience:
                    stopped_early = True
                    say(f"stopping early: no lower val loss in {config.patience} evaluations")
            interval = config.checkpoint_interval
            if at_end or stopped_early or trainer.step == end_step or (interval and trainer.step % interval == 0):
                save_last()
            if stopped_early:
                break
    trainer.metrics.plot(out / PLOT_FILE)

    # the best weights become the output model (merged for LoRA, with the adapter beside it)
    model.load_state_dict(load_file(str(out / CHECKPOINT_DIR / "best.safetensors"), device=str(device)), strict=False)
    model.activation_checkpointing = False
    if config.lora:
        save_adapter(model, config.lora_config(), out / ADAPTER_DIR, base_model=config.model)
        merge_lora(model)
    _set_dropout(model, saved_dropout)
    sample = None
    if classifying:
        assert isinstance(model, GPTForSequenceClassification)
        write_classifier(model, data.labels, tokenizer, out)
    else:
        write_model(model, tokenizer, out)
        if config.sample_tokens:
            sample = sample_text(model, tokenizer, train_config)
            (out / SAMPLE_FILE).write_text(sample, encoding="utf-8")
    best_accuracy = progress_state.get("best_val_accuracy")
    return FinetuneResult(out, trainer.step, int(progress_state["best_step"]), float(progress_state["best_val_loss"]),
                          float(progress_state["first_val_loss"]), stopped_early, notes, sample,
                          None if best_accuracy is None else float(best_accuracy), B,
                          plan.grad_accum_steps)  # fmt: skip


def write_classifier(model: GPTForSequenceClassification, labels: LabelSet, tokenizer: Any, out: Path) -> None:
    """The classifier (GPT2ForSequenceClassification's layout, id2label / label2id) + tokenizer, staged then moved."""
    staging = out / ".model.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    save_classifier(model, staging, labels)
    tokenizer.save(staging)
    for path in staging.iterdir():
        os.replace(path, out / path.name)
    staging.rmdir()


def write_model(model: GPT, tokenizer: Any, out: Path) -> None:
    """The HF-format model, tokenizer and chat template, written into a staging folder and then moved into `out`
    file by file (a crash never leaves a half-written weights file there)."""
    staging = out / ".model.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_pretrained(model, staging)
    tokenizer.save(staging)
    save_chat_template(staging)
    for path in staging.iterdir():
        os.replace(path, out / path.name)
    staging.rmdir()


__all__ = ["FinetuneConfig", "FinetuneResult", "finetune", "parse_bytes", "plan_memory", "prepare", "METRICS_FILE"]
