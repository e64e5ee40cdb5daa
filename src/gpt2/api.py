"""The facade: a model together with its tokenizer, loaded from anywhere we read, checked to belong together.

This is what the CLI and the server use, and the short way in for Python users (litgpt's `api.LLM` is the
pattern):

>>> llm = LLM.load("gpt2", precision="int8")                                   # doctest: +SKIP
>>> llm.generate("The meaning of life is", SamplingParams(max_tokens=20, seed=0))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import torch

from gpt2.inference.generation import generate_texts, stream_text
from gpt2.inference.layouts import prepare_for_inference
from gpt2.inference.sampling import SamplingParams
from gpt2.model import GPT
from gpt2.runtime.device import resolve_device
from gpt2.runtime.gguf import is_gguf
from gpt2.tokenizer import load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights import load_model, save_pretrained

Batch = list[list[str]]  # for each prompt, its continuations


@dataclass
class LLM:
    """A GPT and the tokenizer it was trained with, on one device."""

    model: GPT
    tokenizer: TextTokenizer
    device: torch.device

    def __post_init__(self) -> None:
        check_compatible(self.model, self.tokenizer)

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str],
        *,
        tokenizer: str | os.PathLike[str] | None = None,
        device: str | torch.device = "auto",
        precision: str | None = None,
    ) -> LLM:
        """Load a model (HF directory or Hub name, OpenAI's TF release, llm.c `.bin`) and its tokenizer.

        tokenizer: a directory, Hub name or 'bytes'; by default the one stored with the model (the directory,
        or the folder holding an llm.c file). precision: None keeps the trainable float32 model; one of
        `PRECISIONS` ('float32', 'bfloat16', 'float16' (GPU only), 'int8', 'int4') turns it into the fastest
        inference form (see prepare_for_inference; README's "Precisions" table says what each computes).
        """
        resolved = device if isinstance(device, torch.device) else resolve_device(device)
        loaded = load_model(model).to(resolved)  # first: a wrong model path is named as such
        if precision is not None:
            prepare_for_inference(loaded, precision)
        return cls(loaded, _tokenizer_for(model, tokenizer), resolved)

    def stream(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, **engine_options: object
    ) -> Iterator[str]:
        """The continuation of `prompt` (text or token ids) as text pieces, while it is generated (`stream_text`)."""
        return stream_text(self.model, self.tokenizer, prompt, params or SamplingParams(), **engine_options)

    @overload
    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> list[str]: ...
    @overload
    def generate(
        self, prompt: list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[list[str]]: ...

    def generate(
        self, prompt: str | Sequence[int] | list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[str] | Batch:
        """`params.n` continuations of `prompt` (the i-th with seed + i when seeded); for a list of prompts, a
        list of those, in order, decoded together in one batch (`generate_texts`). num_beams > 1: the n best
        beams."""
        params = params or SamplingParams()
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return generate_texts(self.model, self.tokenizer, prompt, params)
        if params.num_beams > 1:
            return generate_texts(self.model, self.tokenizer, [prompt], params)[0]  # type: ignore[list-item]
        return ["".join(self.stream(prompt, params.for_sample(i))) for i in range(params.n)]  # type: ignore[arg-type]

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """The model in HF format with its tokenizer beside it: what `LLM.load` and transformers read."""
        save_pretrained(self.model, directory)
        return self.tokenizer.save(Path(directory))


def _tokenizer_for(model: str | os.PathLike[str], tokenizer: str | os.PathLike[str] | None) -> TextTokenizer:
    if tokenizer is not None:
        return load_tokenizer(tokenizer)
    local = Path(model).expanduser()
    if is_gguf(local):
        return load_tokenizer(local)  # a GGUF file carries its tokenizer
    source = local.parent if local.is_file() else model  # an llm.c file: look in its folder
    try:
        return load_tokenizer(source)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no tokenizer saved with the model ({err}); pass --tokenizer DIR_OR_NAME") from err


def check_compatible(model: GPT, tokenizer: TextTokenizer) -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding for."""
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}; "
            "pass the tokenizer the model was trained with (--tokenizer)"
        )
