"""What several subcommands share: loading a model together with the tokenizer it was trained with."""

from __future__ import annotations

from typing import Any

import torch

from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer


def load_model_and_tokenizer(model_name: str, tokenizer_name: str | None, device: torch.device) -> tuple[GPT, Any]:
    """The model (any format `GPT.from_pretrained` reads) on `device`, and its tokenizer: `tokenizer_name` when
    given, else the one saved beside the model (as `gpt2 train` does) or the Hub repo's own."""

    model = GPT.from_pretrained(model_name).to(device)  # first: a wrong --model is named as such
    try:
        tokenizer = load_tokenizer(tokenizer_name or model_name)
    except FileNotFoundError as err:
        if tokenizer_name:
            raise
        raise FileNotFoundError(f"no tokenizer saved with the model ({err}); pass --tokenizer DIR_OR_NAME") from err
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}; "
            "pass the tokenizer the model was trained with (--tokenizer)"
        )
    return model, tokenizer
