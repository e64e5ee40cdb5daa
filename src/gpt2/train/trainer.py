"""The Trainer: one optimizer step read as a recipe, evaluation, resumable checkpoints, and the loop around them.

A Trainer is made from a model, its optimizer, the TrainConfig and its `TrainingData` (batches, and the loss as
a function of (model, batch)). Pretraining (`gpt2.train.pretrain.train`) uses the defaults: `BatchLoader`
next-token batches and `next_token_loss`. A variant changes only what differs, for example a classifier on the
last position:

    >>> def last_token_loss(model, batch):                                        # doctest: +SKIP
    ...     x, labels = batch                                                     # (B, T), (B,)
    ...     return F.cross_entropy(model(x).logits[:, -1], labels)
    >>> data = TrainingData(batches, loss_fn=last_token_loss)                     # doctest: +SKIP
    >>> trainer = Trainer(model, optimizer, config, data)                          # doctest: +SKIP
    >>> result = trainer.fit()                                                     # doctest: +SKIP

`train_step` follows llm.c's order: set the LR; run `grad_accum_steps` micro-steps, each adding
loss / grad_accum_steps to the gradients (DDP all-reduces on the last one only); clip; step; zero the
gradients; synchronize the device; log.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast, runtime_checkable

import numpy as np
import torch
import torch.nn as nn

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.runtime.device import autocast, resolve_dtype, synchronize
from gpt2.tokenizer import TextTokenizer
from gpt2.train.checkpoint import (
    TRAIN_STATE_FORMAT,
    TRAIN_STATE_VERSION,
    load_checkpoint_weights,
    load_train_state,
    load_trainable,
    rng_state,
    save_checkpoint,
    save_trainable_checkpoint,
    set_rng_state,
)
from gpt2.train.config import TrainConfig
from gpt2.train.distributed import (
    Distributed,
    any_rank,
    distributed_from_env,
    full_model,
    full_optimizer_state,
    gradient_sync,
    is_sharded,
    load_full_model_state,
    load_full_optimizer_state,
    mean_over_ranks,
    replicate,
)
from gpt2.train.metrics import METRICS_FILE, PLOT_FILE, Metrics, flops_per_token, peak_flops
from gpt2.train.optimizer import apply_schedule
from gpt2.train.schedule import schedule_at

Batch = tuple[torch.Tensor, ...]
"""One micro-batch, e.g. (x, y): token ids (B, T) and their targets (B, T)."""
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
"""(model, batch on the device) -> the scalar mean loss of the batch, run under the run's autocast."""
Evaluation = Callable[[nn.Module, int], dict[str, Any]]
"""(model, step) -> figures written to metrics.jsonl at every evaluation (e.g. HellaSwag accuracy)."""


@runtime_checkable
class BatchSource(Protocol):
    """Where training batches come from; `gpt2.data.BatchLoader` is one. Its state_dict must hold only plain
    values (it goes into the checkpoint), and loading it must continue exactly where it stopped."""

    def next_batch(self) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class TrainerCallback:
    """Hooks `Trainer.fit` calls, for what a variant adds around the loop (fine-tuning's best weights and early
    stop, experiment trackers) without a copy of the loop. Every method is optional; `state_dict` must hold
    only plain values: it goes into each checkpoint and comes back through `load_state_dict` on resume."""

    def on_metrics(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """A line just written to metrics.jsonl (a step's figures, a val loss, an evaluation's figures)."""

    def on_evaluate(self, trainer: Trainer, val_loss: float | None, figures: dict[str, Any]) -> None:
        """An evaluation at trainer.step finished: its val loss (None without val batches) and the figures
        of the Trainer's `evaluations`."""

    def should_stop(self, trainer: Trainer) -> bool:
        """Asked after each step's evaluation: True saves a checkpoint and ends fit (stopped_early=True)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict`."""


def next_token_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Pretraining's loss: the mean cross-entropy of the model's next-token logits against the targets y
    (GPT computes it from its logits; targets equal to IGNORE_INDEX do not count)."""
    x, y = batch  # (B, T) each
    return model(x, y).loss


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the step was not applied and no checkpoint was written after it."""


def step_seed(seed: int, rank: int, step: int) -> int:
    """The torch seed of optimizer step `step` on `rank`: the step's randomness (dropout) is a function of
    (seed, rank, step) alone, so a resumed run draws exactly what an uninterrupted one would."""
    words = np.random.SeedSequence([seed, rank, step]).generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


def accumulation_steps(config: TrainConfig, micro_batch_tokens: int, world_size: int) -> int:
    """Micro-steps per optimizer step: config.data.grad_accum_steps, or total_batch_tokens / (tokens of one
    micro-batch on all ranks) when total_batch_tokens is set, which must divide exactly."""
    if config.data.total_batch_tokens is None:
        return config.data.grad_accum_steps
    per_micro_step = micro_batch_tokens * world_size
    if config.data.total_batch_tokens % per_micro_step:
        raise ValueError(
            f"total_batch_tokens={config.data.total_batch_tokens} is not a multiple of batch_size * block_size * "
            f"world_size = {micro_batch_tokens} * {world_size} = {per_micro_step}; change one of them"
        )
    return config.data.total_batch_tokens // per_micro_step


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step did."""

    step: int
    """The number of optimizer steps taken, this one included."""
    loss: float
    """Mean training loss of the step over all micro-steps and ranks."""
    lr: float
    grad_norm: float
    """Global gradient norm before clipping (NaN when clipping is off)."""
    seconds: float
    tokens: int
    """Tokens of the step over all ranks."""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


@dataclass
class TrainResult:
    """What a run did: per-step train losses (index 0 = step start_step+1), val losses by step, and files."""

    start_step: int
    step: int
    losses: list[float]
    val_losses: dict[int, float]
    out_dir: Path
    checkpoint: Path | None
    interrupted: bool = False
    stopped_early: bool = False
    """A callback's should_stop ended the run before end_step."""
    sample: str | None = None
    tokens_per_second: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class TrainingData:
    """What the model learns from: the training batches, a factory of val sources (a fresh one per evaluation, so
    every evaluation sees the same batches), the loss of a batch, and the tokenizer saved into every checkpoint."""

    batches: BatchSource
    val_batches: Callable[[], BatchSource] | None = None
    loss_fn: LossFn = next_token_loss
    tokenizer: TextTokenizer | None = None


@dataclass(frozen=True)
class Placement:
    """Where the steps run; each default is found once: the model's device, config.runtime.dtype resolved for
    it, and torchrun's environment."""

    device: torch.device | None = None
    dtype: torch.dtype | None = None
    dist: Distributed | None = None


@dataclass(frozen=True)
class LoopOptions:
    """How `fit` runs around the step. grad_accum_steps: default from config (`accumulation_steps`). end_step:
    stop (and save) after this step although the LR schedule runs to max_steps. evaluations: more figures
    measured at every evaluation. callbacks: hooks around the loop (`TrainerCallback`). checkpoint_weights:
    "model" saves the whole GPT (HF layout) and refreshes the model in OUT; "trainable" only the parameters that
    train (fine-tuning: its frozen weights come from the pretrained model). log: receives status lines (rank 0
    only)."""

    grad_accum_steps: int | None = None
    end_step: int | None = None
    evaluations: Sequence[Evaluation] = ()
    callbacks: Sequence[TrainerCallback] = ()
    checkpoint_weights: Literal["model", "trainable"] = "model"
    log: Callable[[str], None] | None = None


class Trainer:
    """Trains `model` with `optimizer` as `config` says, on `data` (`TrainingData`: batches, val batches, loss,
    tokenizer), where `placement` says, around the loop as `loop` says (`LoopOptions`).

    model: on its device; under FSDP already sharded (`gpt2.train.distributed.shard`, before the optimizer is
    built); the Trainer adds the DDP wrapper and torch.compile itself. Files go into config.output.out_dir (rank
    0 only).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: TrainConfig,
        data: TrainingData,
        placement: Placement | None = None,
        loop: LoopOptions | None = None,
    ) -> None:
        placement = Placement() if placement is None else placement
        loop = LoopOptions() if loop is None else loop
        self.config = config
        self.dist = distributed_from_env() if placement.dist is None else placement.dist
        self.device = next(model.parameters()).device if placement.device is None else placement.device
        self.dtype = resolve_dtype(config.runtime.dtype, self.device) if placement.dtype is None else placement.dtype
        if loop.grad_accum_steps is None and config.data.total_batch_tokens is not None:
            raise ValueError("config.total_batch_tokens is set: pass grad_accum_steps=accumulation_steps(...)")
        self.grad_accum_steps = config.data.grad_accum_steps if loop.grad_accum_steps is None else loop.grad_accum_steps
        if self.grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be a positive integer, got {self.grad_accum_steps}")
        max_steps = config.schedule.max_steps
        self.end_step = max_steps if loop.end_step is None else min(loop.end_step, max_steps)
        self.optimizer = optimizer
        self.batches = data.batches
        self.val_batches = data.val_batches
        self.loss_fn = data.loss_fn
        self.tokenizer = data.tokenizer
        self.evaluations = list(loop.evaluations)
        self.callbacks = list(loop.callbacks)
        self.checkpoint_weights = loop.checkpoint_weights
        self.log = loop.log if (loop.log is not None and self.dist.is_main) else None
        self.out_dir = Path(config.output.out_dir)
        self.metrics = Metrics(self.out_dir / METRICS_FILE, enabled=self.dist.is_main)

        # The model as given is what is saved and scored; `forward_model` adds the wrappers training runs through.
        self.model = model
        self.sharded = self.dist.enabled and is_sharded(model)
        if self.dist.enabled and config.runtime.parallel == "fsdp" and not self.sharded:
            raise ValueError("parallel='fsdp': shard the model (gpt2.train.distributed.shard) before its optimizer")
        forward_model = replicate(model, self.device) if self.dist.enabled and not self.sharded else model
        self.forward_model = cast(nn.Module, torch.compile(forward_model)) if config.runtime.compile else forward_model
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls for any float32 work left outside autocast
            torch.backends.cudnn.allow_tf32 = True
        model_config = getattr(model, "config", None)
        peak = peak_flops(self.device)
        self._flops_per_token = flops_per_token(model_config) if isinstance(model_config, GPTConfig) else None
        self._peak_flops = peak * self.dist.world_size if peak is not None else None

        self.step = 0
        """Optimizer steps taken (the next step to run is step + 1)."""
        self.checkpoint: Path | None = None
        """The last checkpoint saved (or resumed from): the last good state if training diverges."""
        self.last_loss: float | None = None
        self.last_val_loss: float | None = None

    # ----------------------------------------------------------------------------------- one step
    def learning_rate(self, step: int) -> float:
        """The (AdamW) LR of optimizer step `step` (0-based): warmup, then the schedule's decay to min_lr."""
        return schedule_at(self.config.schedule, step, self.config.optimizer.learning_rate)

    def train_step(self) -> StepStats:
        """One optimizer step. Raises TrainingDiverged (before changing any weight) when the loss is not finite."""
        synchronize(self.device)
        started = time.perf_counter()
        # 1. set the learning rates (and Muon's momentum) of this step, and the seed of its dropout
        lr = apply_schedule(self.optimizer, self.config, self.step)
        torch.manual_seed(step_seed(self.config.runtime.seed, self.dist.rank, self.step))
        # 2. micro-steps: gradients of loss / grad_accum_steps add up to the gradient of the mean loss
        loss_sum = torch.zeros((), device=self.device)
        tokens = 0
        for micro_step in range(self.grad_accum_steps):
            batch = self._on_device(self.batches.next_batch())
            tokens += batch[0].numel()
            with gradient_sync(self.forward_model, enabled=micro_step == self.grad_accum_steps - 1):
                with autocast(self.device, self.dtype):
                    loss = self.loss_fn(self.forward_model, batch) / self.grad_accum_steps
                loss_sum += loss.detach().float()
                self.scaler.scale(loss).backward()
        step_loss = float(mean_over_ranks(loss_sum, self.dist))  # the logged loss is the mean over all ranks
        if not math.isfinite(step_loss):
            raise self._diverged(step_loss)
        # 3. clip, step, zero
        self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip_gradients()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        # 4. sync, time, log
        synchronize(self.device)
        self.step += 1
        self.last_loss = step_loss
        stats = StepStats(self.step, step_loss, lr, grad_norm, time.perf_counter() - started,
                          tokens * self.dist.world_size)  # fmt: skip
        if self.step % self.config.output.log_interval == 0 or self.step == self.end_step:
            self.write_metrics(self._record(stats))
        return stats

    def _on_device(self, batch: Batch) -> Batch:
        return tuple(t.to(self.device, non_blocking=True) for t in batch)

    def _clip_gradients(self) -> float:
        """Clip the global gradient norm to config.optimizer.grad_clip; the norm before clipping (NaN when off)."""
        if self.config.optimizer.grad_clip <= 0:
            return float("nan")
        return float(nn.utils.clip_grad_norm_(self.forward_model.parameters(), self.config.optimizer.grad_clip))

    def _diverged(self, loss: float) -> TrainingDiverged:
        saved = self.checkpoint
        where = f"the last good checkpoint is {saved}" if saved is not None else "no checkpoint was written yet"
        return TrainingDiverged(
            f"loss is {loss} at step {self.step + 1}; training stopped before applying it ({where}). "
            "Lower learning_rate (or raise warmup_steps), check the data, then continue with --resume"
        )

    def _record(self, stats: StepStats) -> dict[str, Any]:
        """The metrics.jsonl line of a step (with MFU where the device's peak FLOP/s is known)."""
        record: dict[str, Any] = {"step": stats.step, "loss": stats.loss, "lr": stats.lr, "grad_norm": stats.grad_norm,
                                  "dt_ms": stats.seconds * 1000, "tokens_per_s": stats.tokens_per_second}  # fmt: skip
        mfu = self.mfu(stats)
        if mfu is not None:
            record["mfu"] = mfu
        return record

    def mfu(self, stats: StepStats) -> float | None:
        """Model FLOPs utilization of a step: its FLOPs per second over the peak of all ranks' devices (None
        when the device's peak or the model's FLOPs per token is unknown)."""
        if self._peak_flops is None or self._flops_per_token is None:
            return None
        return self._flops_per_token * stats.tokens / stats.seconds / self._peak_flops

    # ---------------------------------------------------------------------------------- evaluation
    def evaluate(self) -> float:
        """Mean loss over eval_batches batches of a fresh val source (per rank), averaged over ranks."""
        if self.val_batches is None:
            raise ValueError("this Trainer has no val_batches; pass val_batches=... to evaluate")
        batches = self.val_batches()
        self.forward_model.eval()
        total = torch.zeros((), device=self.device)
        with torch.no_grad():
            for _ in range(self.config.evaluation.eval_batches):
                batch = self._on_device(batches.next_batch())
                with autocast(self.device, self.dtype):
                    total += self.loss_fn(self.forward_model, batch).float()
        self.forward_model.train()
        total /= self.config.evaluation.eval_batches
        return float(mean_over_ranks(total, self.dist))

    def _evaluate_and_log(self) -> float | None:
        """The val loss (None without val batches) and every extra evaluation, written to metrics.jsonl, logged
        and handed to the callbacks."""
        val_loss = None
        if self.val_batches is not None:
            val_loss = self.last_val_loss = self.evaluate()
            self.write_metrics({"step": self.step, "val_loss": val_loss})
            train = f"train loss {self.last_loss:.4f}, " if self.step > 0 and self.last_loss is not None else ""
            self._say(f"step {self.step}: {train}val loss {val_loss:.4f}")
        figures: dict[str, Any] = {}
        for evaluation in self.evaluations:
            result = evaluation(self.model, self.step)
            figures.update(result)
            self.write_metrics({"step": self.step, **result})
        for callback in self.callbacks:
            callback.on_evaluate(self, val_loss, figures)
        return val_loss

    def write_metrics(self, record: dict[str, Any]) -> None:
        """A line of metrics.jsonl, also handed to every callback (rank 0 only)."""
        if not self.dist.is_main:
            return
        self.metrics.write(record)
        for callback in self.callbacks:
            callback.on_metrics(self, record)

    def _say(self, message: str) -> None:
        if self.log is not None:
            self.log(message)

    # ------------------------------------------------------------------------------ save and resume
    def state_dict(self) -> dict[str, Any]:
        """The training state (plain tensors and containers): optimizer, step, RNG, data position, scaler. Under
        FSDP a collective (the optimizer state is gathered)."""
        return {
            "format": TRAIN_STATE_FORMAT,
            "version": TRAIN_STATE_VERSION,
            "step": self.step,
            "optimizer": full_optimizer_state(self.optimizer) if self.sharded else self.optimizer.state_dict(),
            "loader": self.batches.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(self.device),
            "loss": self.last_loss,
            "val_loss": self.last_val_loss,
            "callbacks": [callback.state_dict() for callback in self.callbacks],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict` (the model's weights are loaded separately: see `resume`)."""
        if self.sharded:
            load_full_optimizer_state(self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.batches.load_state_dict(state["loader"])
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"], self.device)
        self.step = int(state["step"])
        for callback, callback_state in zip(self.callbacks, state.get("callbacks", []), strict=False):
            callback.load_state_dict(callback_state)

    def save(self) -> Path | None:
        """Write checkpoint OUT/checkpoints/step_N (model, tokenizer, training state) and refresh the model in
        OUT. Every rank must call it (under FSDP the weights are gathered); rank 0 writes and returns the path."""
        state = self.state_dict()
        config = self.config
        if self.checkpoint_weights == "trainable":
            if self.sharded:
                raise ValueError("checkpoint_weights='trainable' is not supported under FSDP; use 'model'")
            if self.dist.is_main:
                self.checkpoint = save_trainable_checkpoint(self.out_dir, self.step, self.model, state, config,
                                                            config.output.keep_checkpoints)  # fmt: skip
            return self.checkpoint if self.dist.is_main else None
        weights = full_model(self._gpt()) if self.sharded else self._gpt()
        if not self.dist.is_main:
            return None
        self.checkpoint = save_checkpoint(self.out_dir, self.step, weights, self.tokenizer, state, config,
                                          config.output.keep_checkpoints)  # fmt: skip
        return self.checkpoint

    def resume(self, checkpoint: Path) -> None:
        """Continue exactly from `checkpoint` (a folder `save` wrote): weights, optimizer, data position, RNG;
        metrics.jsonl is cut back to its step."""
        state = load_train_state(checkpoint)
        if self.checkpoint_weights == "trainable":
            load_trainable(self.model, checkpoint)
        elif self.sharded:
            weights = full_model(self._gpt())  # an unsharded copy to read the file into, then sharded again
            load_checkpoint_weights(weights, checkpoint)
            load_full_model_state(self.model, weights.state_dict())
        else:
            load_checkpoint_weights(self._gpt(), checkpoint)
        self.load_state_dict(state)
        self.checkpoint = checkpoint
        self.metrics.start(resume_step=self.step)

    def _gpt(self) -> GPT:
        """The model, which checkpoints (GPT-2's HF layout) require to be a GPT."""
        if not isinstance(self.model, GPT):
            raise ValueError(
                f"save() and resume() write and read GPT checkpoints, but the model is a {type(self.model).__name__}; "
                "use state_dict() / load_state_dict() and save the model yourself"
            )
        return self.model

    # ------------------------------------------------------------------------------------ the loop
    def fit(self, progress: bool = False) -> TrainResult:
        """Train from `step` to `end_step`: evaluate before the first step of a fresh run and every eval_interval
        steps; save every checkpoint_interval steps and at the end; on Ctrl-C finish the step, save and return
        (interrupted=True); when a callback's should_stop says so, save and return (stopped_early=True).
        progress: show a progress bar."""
        from tqdm.auto import tqdm

        config = self.config
        start_step = self.step
        if not self.metrics.started:
            self.metrics.start()
        losses: list[float] = []
        val_losses: dict[int, float] = {}
        timed_tokens, timed_seconds = 0, 0.0
        interrupted = stopped_early = False
        started = time.perf_counter()
        bar = tqdm(total=config.schedule.max_steps, initial=start_step, unit="step", dynamic_ncols=True,
                   disable=not (progress and self.dist.is_main))  # fmt: skip
        with _StopFlag() as stop, bar:
            if config.evaluation.eval_interval and self.step == 0:
                self._keep(val_losses, self._evaluate_and_log())
            while self.step < self.end_step:
                stats = self.train_step()
                losses.append(stats.loss)
                if stats.step > start_step + 1 or stats.step == self.end_step:  # the first step pays one-off costs
                    timed_tokens += stats.tokens
                    timed_seconds += stats.seconds
                bar.set_postfix_str(self._postfix(stats), refresh=False)
                bar.update(1)
                if config.evaluation.eval_interval and (
                    self.step % config.evaluation.eval_interval == 0 or self.step == config.schedule.max_steps
                ):
                    self._keep(val_losses, self._evaluate_and_log())
                    self.metrics.plot(self.out_dir / PLOT_FILE)
                stop_now = any_rank(stop.requested, self.device, self.dist)
                if self.callbacks:
                    stopped_early = any_rank(any(c.should_stop(self) for c in self.callbacks), self.device, self.dist)
                interval = config.output.checkpoint_interval
                if (interval and self.step % interval == 0) or self.step == self.end_step or stop_now or stopped_early:
                    self.save()
                if stop_now:
                    interrupted = True
                    self._say(f"interrupted: checkpoint at step {self.step} saved in {self.checkpoint}; "
                              "continue with --resume")  # fmt: skip
                    break
                if stopped_early:
                    break
        self.metrics.plot(self.out_dir / PLOT_FILE)
        return TrainResult(
            start_step=start_step, step=self.step, losses=losses, val_losses=val_losses, out_dir=self.out_dir,
            checkpoint=self.checkpoint, interrupted=interrupted, stopped_early=stopped_early,
            seconds=time.perf_counter() - started,
            tokens_per_second=timed_tokens / timed_seconds if timed_seconds else 0.0,
        )  # fmt: skip

    def _keep(self, val_losses: dict[int, float], val_loss: float | None) -> None:
        if val_loss is not None:
            val_losses[self.step] = val_loss

    def _postfix(self, stats: StepStats) -> str:
        text = f"loss {stats.loss:.4f} lr {stats.lr:.2e} {stats.tokens_per_second:,.0f} tok/s"
        mfu = self.mfu(stats)
        return text if mfu is None else text + f" MFU {100 * mfu:.1f}%"


class _StopFlag:
    """Ctrl-C (SIGINT) sets the flag; the loop finishes its step, saves and returns. A second Ctrl-C raises
    KeyboardInterrupt at once. Only installed in the main thread, and never where SIGINT is ignored: a job
    started as `nohup gpt2 train ... &` inherits SIG_IGN and must go on ignoring Ctrl-C."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
