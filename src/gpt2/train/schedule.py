"""The learning-rate schedule: linear warmup, then cosine decay to a floor (GPT-2/3, llm.c, nanoGPT)."""

from __future__ import annotations

import math


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
