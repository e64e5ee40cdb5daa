"""What every exporter shares: the tensors as float32 arrays, and the check
that the tokenizer belongs to the model."""

from __future__ import annotations

import numpy as np
import torch

from gpt2.model import GPT
from gpt2.tokenizer.protocol import TextTokenizer


def unwrap(model: GPT) -> GPT:
    """The GPT inside a torch.compile or DDP wrapper (their parameter names carry a prefix)."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def float32_tensors(model: GPT) -> dict[str, np.ndarray]:
    """Every tensor of GPT-2's biased layout under our names, float32 on the CPU, Linear weights [out, in].

    `lm_head.weight` appears only when it is not tied to `wte`. A model built with bias=False gets zero biases:
    the same function in the layout every exporter's target expects.
    """
    model = unwrap(model)
    state = model.state_dict()
    arrays = {
        name: tensor.detach().to(device="cpu", dtype=torch.float32).numpy()
        for name, tensor in state.items()
        if name != "lm_head.weight"
    }
    for name in list(arrays):
        bias = name.removesuffix(".weight") + ".bias"
        if name.endswith(".weight") and name not in ("transformer.wte.weight", "transformer.wpe.weight"):
            arrays.setdefault(bias, np.zeros(arrays[name].shape[0], dtype=np.float32))
    if "lm_head.weight" in state and model.lm_head.weight is not model.transformer.wte.weight:
        head = state["lm_head.weight"]
        if not torch.equal(head, state["transformer.wte.weight"]):
            arrays["lm_head.weight"] = head.detach().to(device="cpu", dtype=torch.float32).numpy()
    return arrays


def check_tokenizer_fits(model: GPT, tokenizer: TextTokenizer) -> None:
    """Refuse a tokenizer that produces ids the model has no embedding row for."""
    vocab_size = unwrap(model).config.vocab_size
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model only {vocab_size}; "
            "pass the tokenizer the model was trained with (--tokenizer)"
        )
