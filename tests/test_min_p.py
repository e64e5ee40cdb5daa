"""min_p: one SamplingParams field, one logits processor with transformers' MinPLogitsWarper meaning, the same
in the Python API, `gpt2 sample --min-p` and the server's `min_p` body field (read by the `openai` client's
extra_body, as vLLM and llama-server take it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt2.api import LLM
from gpt2.cli import build_parser
from gpt2.cli.common import sampling_params
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams, build_processors
from gpt2.inference.processors import MinP
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer
from gpt2.weights import save_pretrained


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.1", float("nan")])
def test_min_p_outside_zero_to_one_is_refused(bad):
    with pytest.raises(ValueError, match="min_p must be a number in \\[0, 1\\]"):
        SamplingParams(min_p=bad)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("min_p", [0.05, 0.3, 1.0])
def test_min_p_bans_what_transformers_min_p_warper_bans(temperature, min_p):
    transformers = pytest.importorskip("transformers")
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 300, generator=generator) * 3
    ids = torch.zeros(4, 1, dtype=torch.long)
    scaled = transformers.TemperatureLogitsWarper(temperature)(ids, logits.clone())
    expected = transformers.MinPLogitsWarper(min_p)(ids, scaled)
    ours = MinP(min_p, temperature)(ids, logits.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    kept = ~torch.isinf(ours)
    assert torch.equal(ours[kept], logits[kept])  # the rest is the sampler's: it divides by the temperature


def test_min_p_is_a_processor_only_when_it_can_change_a_draw():
    names = [type(rule).__name__ for rule in build_processors(SamplingParams(min_p=0.1), prompt_length=1,
                                                               vocab_size=10)]  # fmt: skip
    assert names == ["MinP"]
    assert build_processors(SamplingParams(min_p=0.1, temperature=0), prompt_length=1, vocab_size=10) == []
    assert build_processors(SamplingParams(), prompt_length=1, vocab_size=10) == []


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=257, block_size=64))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    directory = tmp_path_factory.mktemp("tiny")
    save_pretrained(model, directory)
    ByteTokenizer().save(directory)
    return directory


def test_min_p_one_draws_the_greedy_text(model_dir):
    llm = LLM.load(model_dir, device="cpu")
    greedy = llm.generate("To be", SamplingParams(max_tokens=12, temperature=0))
    sampled = llm.generate("To be", SamplingParams(max_tokens=12, temperature=1.0, min_p=1.0, seed=3))
    free = [llm.generate("To be", SamplingParams(max_tokens=12, temperature=1.0, seed=s)) for s in range(3)]
    assert sampled == greedy and any(text != greedy for text in free)


def test_cli_min_p_flag_reaches_sampling_params():
    args = build_parser().parse_args(["sample", "--model", "m", "--min-p", "0.25"])
    assert sampling_params(args).min_p == 0.25
    with pytest.raises(ValueError, match="min_p"):
        sampling_params(build_parser().parse_args(["sample", "--model", "m", "--min-p", "2"]))


def test_server_applies_min_p_from_the_openai_clients_extra_body(model_dir):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gpt2.serve import ServerConfig
    from gpt2.serve.app import create_app

    llm = LLM.load(model_dir, device="cpu")
    greedy = llm.generate("To be", SamplingParams(max_tokens=12, temperature=0))[0]
    with TestClient(create_app(LLM.load(model_dir, device="cpu"), ServerConfig(model_name="tiny"))) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        answer = client.completions.create(model="tiny", prompt="To be", max_tokens=12, temperature=1.0, seed=3,
                                           extra_body={"min_p": 1.0})  # fmt: skip
        assert answer.choices[0].text == greedy
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="tiny", prompt="To be", max_tokens=2, extra_body={"min_p": 2})
    assert refused.value.body["param"] == "min_p"
