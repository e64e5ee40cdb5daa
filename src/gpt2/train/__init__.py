"""Training: config, Trainer, schedule, optimizer, distributed, metrics, run state."""

from gpt2.train.core import *  # noqa: F403
