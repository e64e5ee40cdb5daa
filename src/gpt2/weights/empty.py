"""A model whose tensors are allocated but not initialised, for loaders that overwrite every one of them."""

from __future__ import annotations

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT


def empty_model(config: GPTConfig, device: torch.device | str = "cpu") -> GPT:
    """GPT(config) built on the meta device (no allocation, no random init), then given uninitialised storage
    on `device`. Every parameter must be written before use; the tied head shares wte's storage again."""
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device=device)
    model.lm_head.weight = model.transformer.wte.weight  # to_empty allocates each tensor apart: re-tie
    return model
