"""One sampler for every path: the server's engine draws what `LLM.generate` draws for the same seed, at every
temperature (including the vanishing ones that are greedy), and the rules of SamplingParams apply in both."""

from __future__ import annotations

import threading

import pytest
import torch

from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference.sampling import SamplingParams
from gpt2.model import GPT
from gpt2.serve import Engine, SequenceOutput, SequenceRequest
from gpt2.tokenizer import ByteTokenizer

WAIT_SECONDS = 60


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=ByteTokenizer.vocab_size, block_size=64))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
        model.transformer.wte.weight[ByteTokenizer.eot_token].zero_()  # greedy text runs on
    return model.eval()


def engine_text(prompt: str, params: SamplingParams) -> str:
    engine = Engine(tiny_gpt(), ByteTokenizer(), max_batch=2)
    pieces: list[str] = []
    done = threading.Event()

    def sink(output: SequenceOutput) -> None:
        pieces.append(output.text)
        if output.final:
            done.set()

    engine.submit([SequenceRequest(ByteTokenizer().encode(prompt), params)], sink)
    assert done.wait(WAIT_SECONDS)
    engine.stop()
    return "".join(pieces)


@pytest.mark.parametrize("temperature", [1e-45, 1e-6, 0.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_draws_what_llm_generate_draws(temperature: float, seed: int) -> None:
    params = SamplingParams(max_tokens=16, temperature=temperature, seed=seed)
    offline = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu")).generate("Hello", params)[0]
    assert engine_text("Hello", params) == offline
