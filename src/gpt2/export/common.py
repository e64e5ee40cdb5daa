"""What every exporter shares: writing through a temporary file, the tensors as float32 arrays, and the check
that the tokenizer belongs to the model."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from gpt2.model import GPT
from gpt2.tokenizer.protocol import TextTokenizer


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed onto `path` only when the block finishes, so a crash or
    an error never leaves half a file under the real name (writers such as gguf's stream to a path, so
    `gpt2.runtime.files.atomic_write_bytes`, which takes the whole file in memory, does not fit them)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"--out {path} is a directory; give the file to write, e.g. {path / 'model.bin'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        yield Path(temporary)
        with open(temporary, "rb+") as file:
            os.fsync(file.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # what open(path, "w") would give, not mkstemp's private 0o600
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
