"""A fine-tuning run: a pretrained model and ITS tokenizer, a data file, the Trainer's loop, keep the best.

`finetune(config)` loads the model (HF directory or Hub name) with the tokenizer stored beside it, reads and
tokenizes the data (the task: `gpt2.finetune.tasks`), splits off a val set, and trains with the `Trainer` (full
weights, or LoRA adapters only): its loop, its atomic checkpoints of the trainable parameters, its Ctrl-C save.
The fine-tuning specifics are its pluggable parts: the task's batches, loss and evaluations, and the
`BestWeights` callback (`gpt2.finetune.best`), which keeps the weights with the lowest val loss and optionally
stops early. Everything is checked before anything is written: a bad file or setting leaves out_dir untouched.
The result in out_dir is a normal HF-format model + tokenizer (+ chat_template.json), with metrics.jsonl,
loss.png, sample.txt, and for LoRA adapter/ in PEFT's format; checkpoints/step_N resume exactly (`resume`),
as `gpt2 train`'s do, and `overwrite` starts over a run that has checkpoints.

task="classification" trains `GPTForSequenceClassification` (the pretrained backbone plus a new `score` head,
N(0, 0.02)) on JSONL/CSV text + label records, reports val accuracy at each evaluation and writes the classifier
in transformers' GPT2ForSequenceClassification layout (config.json with id2label / label2id) + the tokenizer.

Before anything is written the run's memory is estimated (`gpt2.finetune.memory`) and checked against
memory_budget (default: 0.9 x the free memory of the device); batch_size=auto picks the largest micro-batch that
fits and the gradient accumulation that keeps the global batch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2.finetune.best import BestWeights
from gpt2.finetune.config import AUTO, FinetuneConfig, parse_bytes
from gpt2.finetune.lora import add_lora, lora_state_dict, merge_lora, save_adapter
from gpt2.finetune.memory import GIB, MemoryEstimate, auto_batch_size, check_fits, estimate_memory
from gpt2.finetune.tasks import TASKS, set_dropout
from gpt2.model import GPT
from gpt2.runtime.device import resolve_dtype
from gpt2.runtime.files import atomic_write_text
from gpt2.train.checkpoint import previous_checkpoint
from gpt2.train.distributed import Distributed
from gpt2.train.metrics import METRICS_FILE
from gpt2.train.optimizer import configure_optimizer
from gpt2.train.pretrain import sample_text
from gpt2.train.tracking import Tracking, require_trackers
from gpt2.train.trainer import LoopOptions, Placement, Trainer, TrainingData

ADAPTER_DIR = "adapter"
SAMPLE_FILE = "sample.txt"
DEFAULT_BUDGET_FRACTION = 0.9  # of the device's free memory, when memory_budget is not set


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
    dtype = resolve_dtype(config.train.runtime.dtype, device)
    lora_params = sum(t.numel() for t in lora_state_dict(model).values()) if config.lora else None
    checkpointing = config.train.runtime.activation_checkpointing
    if config.batch_size == AUTO:
        global_batch = config.global_batch_size or 8 * config.train.data.grad_accum_steps
        plan = auto_batch_size(model.config, block_size, budget, global_batch_size=global_batch, dtype=dtype,
                               lora_params=lora_params, activation_checkpointing=checkpointing)  # fmt: skip
        batch_size, grad_accum_steps = plan.batch_size, plan.grad_accum_steps
    else:
        batch_size, grad_accum_steps = int(config.batch_size), config.train.data.grad_accum_steps

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
    interrupted: bool = False
    """Ctrl-C: a checkpoint was saved and no output model written; continue with resume=True."""


def finetune(
    config: FinetuneConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> FinetuneResult:
    """Fine-tune as `config` says (see the module docstring). resume: continue from the latest checkpoint in
    out_dir; overwrite: start again although out_dir holds checkpoints (they are deleted; without it that is a
    FileExistsError). stop_at_step: save and return after this step although the LR schedule runs to max_steps."""
    say = log or (lambda message: None)
    out = Path(config.out_dir)
    require_trackers(config.train.output.log_to)  # a missing extra is refused before anything is written
    task = TASKS[config.task](config)
    for note in task.notes:
        say(note)
    model, device = task.model, task.llm.device
    saved_dropout = model.config.dropout  # the output model keeps the dropout it came with
    if config.train.model.dropout is not None:
        set_dropout(model, config.train.model.dropout)
    if config.lora:
        add_lora(model, config.lora_config())
    plan = plan_memory(config, model, task.block_size, device)  # refuses a run that cannot fit, before any write
    for line in plan.lines:
        say(line)
    checkpoint = previous_checkpoint(out, resume, overwrite, Distributed())
    model.activation_checkpointing = config.train.runtime.activation_checkpointing
    B, seed = plan.batch_size, config.train.runtime.seed
    train_config = config.training(task.block_size, max(1, math.ceil(task.val_count / B)), B, plan.grad_accum_steps)
    torch.manual_seed(seed)
    best, tracking = BestWeights(out, config.patience, say), Tracking(train_config)
    data = TrainingData(task.batches(B, seed), val_batches=task.val_batches(B, seed) if task.val_batches else None,
                        loss_fn=task.loss_fn, tokenizer=task.llm.tokenizer)  # fmt: skip
    loop = LoopOptions(end_step=stop_at_step, evaluations=task.evaluations(B), callbacks=[best, tracking],
                       checkpoint_weights="trainable", log=say)  # fmt: skip
    optimizer = configure_optimizer(model, train_config.optimizer, device)
    trainer = Trainer(model, optimizer, train_config, data, Placement(device=device), loop)
    if checkpoint is not None:
        trainer.resume(checkpoint)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    say(f"fine-tuning {trained:,} of {model.num_parameters():,} parameters on {device}: {task.train_count} train / "
        f"{task.val_count} val {task.unit}" + (f"; resuming at step {trainer.step}" if checkpoint else ""))  # fmt: skip
    model.train()  # LLM.load gives an inference-mode model: dropout must be on while training
    try:
        result = trainer.fit(progress=progress)
        done = FinetuneResult(out, trainer.step, best.progress.best_step, best.progress.best_val_loss,
                              best.progress.first_val_loss, result.stopped_early, task.notes,
                              best_val_accuracy=best.progress.best_val_accuracy, batch_size=B,
                              grad_accum_steps=plan.grad_accum_steps, interrupted=result.interrupted)  # fmt: skip
        if result.interrupted:
            return done
        # the best weights become the output model (merged for LoRA, with the adapter beside it)
        best.load_best(model)
        model.activation_checkpointing = False
        if config.lora:
            save_adapter(model, config.lora_config(), out / ADAPTER_DIR, base_model=config.model)
            merge_lora(model)
        set_dropout(model, saved_dropout)
        task.write(model, out)
        if config.task == "lm" and train_config.evaluation.sample_tokens:
            done.sample = sample_text(model, task.llm.tokenizer, train_config)
            atomic_write_text(out / SAMPLE_FILE, done.sample)
            tracking.text("sample", done.sample)
        return done
    finally:
        tracking.close()


__all__ = ["FinetuneConfig", "FinetuneResult", "finetune", "parse_bytes", "plan_memory", "METRICS_FILE"]
