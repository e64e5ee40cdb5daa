"""Learning-rate schedules: linear warmup, then cosine decay to a floor (GPT-2/3, llm.c, nanoGPT), or
warmup-stable-decay (WSD: hold the peak, then decay linearly to the floor over the last fraction of the run,
as modded-nanogpt and nanochat do)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpt2.train.config import ScheduleConfig


def learning_rate_at(step: int, *, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warmup to max_lr over warmup_steps (step 0
    already gets max_lr / warmup_steps, as in llm.c), then cosine decay to min_lr at step decay_steps, then
    min_lr.

    >>> [round(learning_rate_at(s, max_lr=1.0, min_lr=0.1, warmup_steps=2, decay_steps=4), 3) for s in range(5)]
    [0.5, 1.0, 1.0, 0.55, 0.1]
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)  # 0 -> 1 over the decay
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def wsd_learning_rate_at(
    step: int, *, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int, decay_fraction: float
) -> float:
    """Warmup-stable-decay: linear warmup as `learning_rate_at`, max_lr until the last decay_fraction of
    decay_steps, then linear decay reaching min_lr at step decay_steps, then min_lr.

    >>> [wsd_learning_rate_at(s, max_lr=1.0, min_lr=0.0, warmup_steps=1, decay_steps=6, decay_fraction=0.5)
    ...  for s in range(7)]
    [1.0, 1.0, 1.0, 1.0, 0.6666666666666667, 0.33333333333333337, 0.0]
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    decay_start = max(warmup_steps, decay_steps - round(decay_fraction * decay_steps))
    if step < decay_start:
        return max_lr
    progress = (step - decay_start) / (decay_steps - decay_start)  # 0 -> 1 over the decay
    return max_lr + progress * (min_lr - max_lr)


def schedule_at(config: ScheduleConfig, step: int, max_lr: float) -> float:
    """The LR of step `step` under config.lr_schedule for a peak of max_lr (floor max_lr * min_lr_ratio,
    warmup_steps, decaying until max_steps)."""
    min_lr = max_lr * config.min_lr_ratio
    if config.lr_schedule == "wsd":
        return wsd_learning_rate_at(step, max_lr=max_lr, min_lr=min_lr, warmup_steps=config.warmup_steps,
                                    decay_steps=config.max_steps, decay_fraction=config.decay_fraction)  # fmt: skip
    return learning_rate_at(step, max_lr=max_lr, min_lr=min_lr, warmup_steps=config.warmup_steps,
                            decay_steps=config.max_steps)  # fmt: skip
