"""Training: the Trainer and its parts, and pretraining built on it.

Where each thing lives: `config` (TrainConfig in sections, presets, TOML), `trainer` (Trainer: the step,
evaluation, save and resume, the loop; the loss and batch-source interfaces), `pretrain` (train(): GPT
pretraining with a Trainer), `schedule` (the LR schedule), `optimizer` (AdamW groups), `distributed`
(torchrun, DDP/FSDP, full states), `metrics` (metrics.jsonl, loss plot, MFU), `checkpoint` (the run's checkpoint
folders).
"""

from gpt2.train.config import PRESETS, TrainConfig, load_config
from gpt2.train.distributed import Distributed, distributed_from_env
from gpt2.train.metrics import Metrics, flops_per_token, peak_flops
from gpt2.train.optimizer import configure_optimizer, parameter_groups
from gpt2.train.pretrain import train
from gpt2.train.schedule import learning_rate_at
from gpt2.train.trainer import (
    BatchSource,
    LoopOptions,
    LossFn,
    Placement,
    StepStats,
    Trainer,
    TrainingData,
    TrainingDiverged,
    TrainResult,
    accumulation_steps,
    next_token_loss,
    step_seed,
)

__all__ = [
    "PRESETS",
    "BatchSource",
    "Distributed",
    "LoopOptions",
    "LossFn",
    "Placement",
    "Metrics",
    "StepStats",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingData",
    "TrainingDiverged",
    "accumulation_steps",
    "configure_optimizer",
    "distributed_from_env",
    "flops_per_token",
    "learning_rate_at",
    "load_config",
    "next_token_loss",
    "parameter_groups",
    "peak_flops",
    "step_seed",
    "train",
]
