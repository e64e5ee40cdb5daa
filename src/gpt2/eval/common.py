"""What every evaluation shares: eval mode without autograd, the model's device, an optional progress bar."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch

DEFAULT_BATCH_SIZE = 8  # rows per forward: 8 x 1024 x 50257 fp32 logits is 1.6 GB, fine on CPU and GPU

Item = TypeVar("Item")


@contextlib.contextmanager
def evaluation_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the block; the model's previous train/eval mode is restored
    afterwards, even on error, so the training loop can evaluate mid-run."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights live: inputs are built there."""
    return next(model.parameters()).device


def progress_bar(iterable: Iterable[Item], *, enabled: bool, total: int, desc: str) -> Iterable[Item]:
    """`iterable` itself, or wrapped in a tqdm bar counting batches when `enabled`."""
    if not enabled:
        return iterable
    from tqdm import tqdm  # imported only when a bar is wanted

    return tqdm(iterable, total=total, desc=desc, unit="batch", dynamic_ncols=True)
