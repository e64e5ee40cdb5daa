"""The facade: a model together with its tokenizer, loaded from anywhere we read, checked to belong together.

This is what the CLI and the server use, and the short way in for Python users (litgpt's `api.LLM` is the
pattern):

>>> from gpt2 import GPT, GPTConfig, save_pretrained
>>> from gpt2.tokenizer import load_tokenizer
>>> _ = save_pretrained(GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=50257)), tmp / "tiny")  # or a Hub name
>>> _ = load_tokenizer(gpt2_files).save(tmp / "tiny")
>>> llm = LLM.load(tmp / "tiny", precision="int8")  # e.g. LLM.load("gpt2", precision="int8")
>>> texts = llm.generate("The meaning of life is", SamplingParams(max_tokens=20, seed=0))
>>> texts == llm.generate("The meaning of life is", SamplingParams(max_tokens=20, seed=0))  # seeded: reproducible
True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import torch

from gpt2.cpu.layouts import prepare_for_inference
from gpt2.inference.generation import generate_texts, stream_text
from gpt2.inference.lora_batch import AdapterSet
from gpt2.inference.processors import build_processors
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.speculative import Drafter, DraftModel, PromptLookup, speculates, speculative_text
from gpt2.inference.steering import STEERED_ENGINE, Intervention, parse_steering, steer, steered_stream
from gpt2.model import GPT
from gpt2.runtime.device import resolve_device
from gpt2.runtime.gguf import is_gguf
from gpt2.tokenizer import load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights import load_model, save_pretrained

Batch = list[list[str]]  # for each prompt, its continuations
Steering = Sequence[Mapping[str, object] | Intervention]  # see gpt2.inference.steering


@dataclass
class LLM:
    """A GPT and the tokenizer it was trained with, on one device."""

    model: GPT
    tokenizer: TextTokenizer
    device: torch.device
    draft: GPT | None = None
    """Speculative decoding with this smaller model (same tokenizer) drafting (gpt2.inference.speculative)."""
    prompt_lookup: int | None = None
    """Speculative decoding with n-gram (prompt lookup) drafts of this many tokens."""
    adapters: AdapterSet = field(init=False)
    """LoRA adapters on this model, by name (`adapters.add(name, directory)`), chosen per prompt in `generate`."""

    def __post_init__(self) -> None:
        check_compatible(self.model, self.tokenizer)
        self.adapters = AdapterSet(self.model)
        if self.draft is not None and self.prompt_lookup is not None:
            raise ValueError("pass either a draft model or prompt_lookup, not both")
        if self.draft is not None:
            check_compatible(self.draft, self.tokenizer)
        if self.prompt_lookup is not None:
            PromptLookup(num_tokens=self.prompt_lookup)  # validated once

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str],
        *,
        tokenizer: str | os.PathLike[str] | None = None,
        device: str | torch.device = "auto",
        precision: str | None = None,
        draft: str | os.PathLike[str] | None = None,
        prompt_lookup: int | None = None,
        adapters: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> LLM:
        """Load a model (HF directory or Hub name, OpenAI's TF release, llm.c `.bin`) and its tokenizer.

        tokenizer: a directory, Hub name or 'bytes'; by default the one stored with the model (the directory,
        or the folder holding an llm.c file). precision: None keeps the trainable float32 model; one of
        `PRECISIONS` ('float32', 'bfloat16', 'float16' (GPU only), 'int8', 'int4') turns it into the fastest
        inference form (see prepare_for_inference; README's "Precisions" table says what each computes).
        draft: a smaller model with the same tokenizer for speculative decoding, loaded like `model`, same
        precision; prompt_lookup: speculative decoding with n-gram drafts of this many tokens instead.
        adapters: LoRA adapters by name, each a folder in PEFT's format (or a `gpt2 finetune --method lora` output
        folder), checked to fit the model; `generate(..., adapter=NAME)` picks one per prompt.
        """
        resolved = device if isinstance(device, torch.device) else resolve_device(device)
        loaded = load_model(model).to(resolved)  # first: a wrong model path is named as such
        if precision is not None:
            prepare_for_inference(loaded, precision)
        text_tokenizer = _tokenizer_for(model, tokenizer)
        drafter = None
        if draft is not None:
            drafter = load_model(draft).to(resolved)
            if precision is not None:
                prepare_for_inference(drafter, precision)
            _check_draft_tokenizer(draft, text_tokenizer)
        llm = cls(loaded, text_tokenizer, resolved, draft=drafter, prompt_lookup=prompt_lookup)
        for name, directory in (adapters or {}).items():
            llm.adapters.add(name, directory)
        return llm

    def stream(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        adapter: str | None = None,
        steering: Steering = (),
        **engine_options: object,
    ) -> Iterator[str]:
        """The continuation of `prompt` (text or token ids) as text pieces, while it is generated (`stream_text`).

        With a draft model or prompt_lookup, speculative decoding (`speculative_text`: the same text) where
        `speculates(params)` allows it (greedy, no penalties, grammars or beams), as the server's engine decides;
        the rest decode as usual, so a seeded sampled request gives the same text with or without speculation.
        adapter: the name of a loaded LoRA adapter to decode with (default: the model alone).
        steering: interventions applied while generating (gpt2.inference.steering; on the PyTorch path, without
        speculation; with an adapter too: the adapter's view runs the model's own hooked layers)."""
        params = params or SamplingParams()
        model = self.adapters.model_for(self.adapters.resolve(adapter, 1)[0])
        if steering:
            plan = [parse_steering(steering, self.model)]
            pieces = stream_text(model, self.tokenizer, prompt, params, **{**engine_options, **STEERED_ENGINE})
            return steered_stream(self.model, plan, pieces)
        drafter = self._drafter(params)
        if drafter is not None:
            slide_by = engine_options.get("slide_by")
            return speculative_text(model, self.tokenizer, prompt, params, drafter, slide_by=slide_by)  # type: ignore[arg-type]
        return stream_text(model, self.tokenizer, prompt, params, **engine_options)

    def _drafter(self, params: SamplingParams) -> Drafter | None:
        """The drafter for speculative decoding of `params`, or None (none configured, or rules it lacks)."""
        if self.draft is None and self.prompt_lookup is None:
            return None
        rules = build_processors(params, prompt_length=0, vocab_size=self.model.config.vocab_size)
        structured = params.regex is not None or params.json_schema is not None
        return self.new_drafter() if speculates(params, rules=bool(rules) or structured, logprobs=False) else None

    def new_drafter(self) -> Drafter | None:
        """A fresh drafter for the speculative decoding this LLM was given (a draft model or prompt lookup), or
        None. One drafter serves one sequence at a time (the server's engine keeps one for its lone sequence)."""
        if self.draft is not None:
            return DraftModel(self.draft)
        return PromptLookup(num_tokens=self.prompt_lookup) if self.prompt_lookup is not None else None

    @overload
    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        adapter: str | None = None,
        steering: Steering = (),
    ) -> list[str]: ...
    @overload
    def generate(
        self,
        prompt: list[str] | list[list[int]],
        params: SamplingParams | None = None,
        *,
        adapter: str | None | Sequence[str | None] = None,
        steering: Steering = (),
    ) -> list[list[str]]: ...

    def generate(
        self,
        prompt: str | Sequence[int] | list[str] | list[list[int]],
        params: SamplingParams | None = None,
        *,
        adapter: str | None | Sequence[str | None] = None,
        steering: Steering = (),
    ) -> list[str] | Batch:
        """`params.n` continuations of `prompt` (the i-th with seed + i when seeded); for a list of prompts, a
        list of those, in order, decoded together in one batch (`generate_texts`). num_beams > 1: the n best
        beams. adapter: a loaded LoRA adapter's name for every prompt, or one name (or None: the model alone)
        per prompt; prompts with different adapters still decode in one batch (gpt2.inference.lora_batch).
        steering: interventions applied to every continuation (gpt2.inference.steering), e.g.
        `[{"hook": "blocks.6.hook_resid_pre", "vector": direction, "scale": 4.0}]`, with or without adapters.

        A text prompt is plain text: a special-token text such as '<|endoftext|>' in it is encoded character by
        character (tiktoken's rule). To put the special token in, pass ids, e.g.
        `llm.generate(llm.tokenizer.encode(text, allowed_special="all"))` (what `gpt2 serve` does with text
        prompts, as vLLM does)."""
        params = params or SamplingParams()
        batch = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
        if not batch and not (adapter is None or isinstance(adapter, str)):
            raise ValueError("one prompt takes one adapter name (or None), not a list")
        if not batch and params.num_beams == 1:
            return ["".join(self.stream(prompt, params.for_sample(i), adapter=adapter, steering=steering))  # type: ignore[arg-type]
                    for i in range(params.n)]  # fmt: skip
        prompts = prompt if batch else [prompt]
        rows = self.adapters.resolve(adapter, len(prompts))
        if params.num_beams > 1 and len({id(row) for row in rows}) > 1:
            raise ValueError("beam search decodes one adapter at a time; group the prompts by adapter")
        every = [row for row in rows for _ in range(params.n)]  # generate_texts' rows: each prompt's n in turn
        with self._steering(steering) as engine, self.adapters.routed(every) as model:
            texts = generate_texts(model, self.tokenizer, prompts, params, **engine)  # type: ignore[arg-type]
        return texts if batch else texts[0]

    @contextlib.contextmanager
    def _steering(self, steering: Steering) -> Iterator[dict[str, object]]:
        """Every forward under `steering` while open; yields the decode options steered generation needs (none
        without steering)."""
        if not steering:
            yield {}
            return
        with steer(self.model, [parse_steering(steering, self.model)]):
            yield dict(STEERED_ENGINE)

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


def _check_draft_tokenizer(draft: str | os.PathLike[str], tokenizer: TextTokenizer) -> None:
    """Refuse a draft model saved with a different tokenizer (one saved without any is taken on trust)."""
    try:
        own = _tokenizer_for(draft, None)
    except FileNotFoundError:
        return
    if own.identity != tokenizer.identity:
        raise ValueError(
            f"the draft model {draft} was trained with another tokenizer ({own.identity} vs {tokenizer.identity}); "
            "a draft model must share the target's tokenizer"
        )


def check_compatible(model: GPT, tokenizer: TextTokenizer) -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding for."""
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}; "
            "pass the tokenizer the model was trained with (--tokenizer)"
        )
