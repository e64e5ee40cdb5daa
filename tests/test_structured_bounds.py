"""Structured output keeps the schema's key order and bounds numbers as llama.cpp's JSON-schema grammar does
(an integral part of at most 16 digits, a fraction of at most 16), so a sampled number always ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import shared_file
from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.structured import JSON_OBJECT, GrammarCompiler, bounded_schema
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer, load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer

xgrammar = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return load_tokenizer(Path(shared_file("gpt2-bpe/encoder.json")).parent)


@pytest.fixture(scope="module")
def compiler(tokenizer: TextTokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


def accepts(compiler: GrammarCompiler, schema: Any, text: str) -> bool:
    """Whether the grammar of `schema` takes `text` whole and then end-of-text."""
    matcher = xgrammar.GrammarMatcher(compiler.compile(json_schema=schema))
    tokens = [*compiler.tokenizer.encode(text), compiler.tokenizer.eot_token]
    return all(matcher.accept_token(token) for token in tokens) and matcher.is_terminated()


@pytest.mark.slow
def test_keys_come_in_the_schemas_order(compiler):
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
              "required": ["zeta", "alpha"], "additionalProperties": False}  # fmt: skip
    assert accepts(compiler, schema, '{"zeta": 1, "alpha": 2}')
    assert not accepts(compiler, schema, '{"alpha": 2, "zeta": 1}')


@pytest.mark.parametrize(
    "value_schema",
    [{"type": "integer"}, {"type": "integer", "minimum": 5}, {"type": "integer", "maximum": -3}, {"type": "number"}],
)
def test_an_integral_part_has_at_most_16_digits(compiler, value_schema):
    schema = {"type": "object", "properties": {"y": value_schema}, "required": ["y"]}
    sign = "-" if value_schema.get("maximum", 0) < 0 else ""
    assert accepts(compiler, schema, f'{{"y": {sign}{"9" * 16}}}')
    assert not accepts(compiler, schema, f'{{"y": {sign}{"9" * 17}}}')


def test_a_fraction_has_at_most_16_digits_and_any_json_values_are_bounded_too(compiler):
    schema = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    assert accepts(compiler, schema, '{"x": 0.' + "1" * 16 + "}")
    assert not accepts(compiler, schema, '{"x": 0.' + "1" * 17 + "}")
    assert accepts(compiler, JSON_OBJECT, '{"a": [' + "7" * 16 + "]}")
    assert not accepts(compiler, JSON_OBJECT, '{"a": [' + "7" * 17 + "]}")


def test_one_sided_bounds_get_the_other_and_data_is_left_alone():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},
              "default": {"type": "integer", "minimum": 0}}  # fmt: skip
    bounded = bounded_schema(schema)
    assert bounded["properties"]["n"] == {"type": "integer", "minimum": 0, "maximum": 10**16 - 1}
    assert bounded["default"] == {"type": "integer", "minimum": 0} and schema["properties"]["n"] == {
        "type": "integer",
        "minimum": 0,
    }


def test_sampled_integers_end_at_temperature_one():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=257, block_size=128)).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)  # the final hidden state is all ones whatever came before
        model.transformer.wte.weight.zero_()
        model.transformer.wte.weight[ord("7")] = 5.0  # so every step's logits favour "7" by 160: 7s forever
    llm = LLM(model, ByteTokenizer(), torch.device("cpu"))
    schema = {"type": "object", "properties": {"y": {"type": "integer"}}, "required": ["y"]}
    for text in llm.generate("y=", SamplingParams(max_tokens=80, json_schema=schema, seed=0, n=3)):
        assert json.loads(text)["y"] == int("7" * 16), text
