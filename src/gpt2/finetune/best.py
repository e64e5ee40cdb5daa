"""Keep the best weights, stop early: fine-tuning's part of the loop, as a Trainer callback.

At each evaluation `BestWeights` compares the val loss with the best so far; a lower one writes the trainable
parameters to OUT/checkpoints/best.safetensors (atomically) and resets the count of evaluations without
progress, which ends the run at `patience`. Its `FinetuneProgress` goes into every checkpoint, so a resumed run
knows the best so far. Without a val split every evaluation counts as the best (the last weights are the output).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.nn as nn
from safetensors.torch import load_model, save

from gpt2.runtime.files import atomic_write_bytes
from gpt2.train.checkpoint import CHECKPOINTS_DIR, trainable_state
from gpt2.train.trainer import Trainer, TrainerCallback

BEST_FILE = "best.safetensors"


@dataclass
class FinetuneProgress:
    """Where a fine-tuning run stands (saved in each checkpoint)."""

    best_val_loss: float = math.inf
    best_step: int = 0
    first_val_loss: float = math.nan
    evaluations_without_progress: int = 0
    best_val_accuracy: float | None = None
    """task=classification: the val accuracy of the best weights."""


class BestWeights(TrainerCallback):
    """Writes the weights of the lowest val loss to `OUT/checkpoints/best.safetensors`; asks the Trainer to stop
    after `patience` evaluations without a lower one (None: never)."""

    def __init__(self, out_dir: Path, patience: int | None = None, log: Callable[[str], None] | None = None) -> None:
        self.path = Path(out_dir) / CHECKPOINTS_DIR / BEST_FILE
        self.patience = patience
        self.progress = FinetuneProgress()
        self._say = log or (lambda message: None)

    def on_evaluate(self, trainer: Trainer, val_loss: float | None, figures: dict[str, Any]) -> None:
        progress = self.progress
        if val_loss is None:  # no val split: the latest weights are the best
            progress.best_step = trainer.step
            self._write(trainer.model)
            return
        if math.isnan(progress.first_val_loss):
            progress.first_val_loss = val_loss
        if val_loss < progress.best_val_loss:
            progress.best_val_loss, progress.best_step = val_loss, trainer.step
            progress.evaluations_without_progress = 0
            progress.best_val_accuracy = figures.get("val_accuracy")
            self._write(trainer.model)
        else:
            progress.evaluations_without_progress += 1
        accuracy = f", accuracy {figures['val_accuracy']:.3f}" if "val_accuracy" in figures else ""
        self._say(f"step {trainer.step}: val loss {val_loss:.4f}{accuracy} (best {progress.best_val_loss:.4f} at "
                  f"step {progress.best_step})")  # fmt: skip

    def should_stop(self, trainer: Trainer) -> bool:
        if self.patience is None or self.progress.evaluations_without_progress < self.patience:
            return False
        self._say(f"stopping early: no lower val loss in {self.patience} evaluations")
        return True

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.progress)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.progress = FinetuneProgress(**state)

    def load_best(self, model: nn.Module) -> None:
        """Copy the best weights into `model` (the parameters that train; the frozen ones are unchanged)."""
        device = str(next(model.parameters()).device)
        load_model(model, str(self.path), strict=False, device=device)

    def _write(self, model: nn.Module) -> None:
        atomic_write_bytes(self.path, save(trainable_state(model)))
