"""GGUF as input: a GPT-2 GGUF file written by llama.cpp's own converter loads as a model and a tokenizer
(`load_model`, `LLM.load`, `gpt2 sample --model FILE.gguf`) that compute what the HF copy of the same weights
computes: f32 exactly, q8_0 within its rounding, with llama.cpp's own greedy continuation.

Fixture: ../shared/data/fixtures/gguf-tiny/ (its README: the HF model, the converter's f32 and q8_0 files, and
the text llama.cpp printed for them)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_file
from gpt2 import LLM, SamplingParams
from gpt2.cli import main
from gpt2.runtime.gguf import gguf_package
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import load_model
from gpt2.weights.gguf import gguf_tensor_name

LLAMA_CPP_GREEDY = " Asset Asset Frey-(isitionisitionisitionisitionisitionisitionisitionisition"  # its README
TEXTS = ["The quick brown fox", " jumps over\n\tthe lazy dog's back — naïve café 🤗", "<|endoftext|> x 1234"]


@pytest.fixture(scope="module")
def gguf_tiny() -> Path:
    shared_file("fixtures/gguf-tiny/model-q8_0.gguf")
    return shared_file("fixtures/gguf-tiny/model-f32.gguf").parent


def hf_logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import GPT2LMHeadModel

    with torch.no_grad():
        return GPT2LMHeadModel.from_pretrained(directory).eval()(ids).logits


@pytest.mark.slow
def test_an_f32_gguf_computes_the_logits_of_its_hf_copy(gguf_tiny: Path) -> None:
    model = load_model(gguf_tiny / "model-f32.gguf")
    ids = torch.tensor([load_tokenizer(gguf_tiny / "hf").encode(TEXTS[1])])
    with torch.no_grad():
        ours, _ = model(ids)
    torch.testing.assert_close(ours, hf_logits(gguf_tiny / "hf", ids), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_q8_0_gguf_gives_each_weight_as_q8_0_rounds_it(gguf_tiny: Path) -> None:
    # q8_0: blocks of 32 values along the input, a float16 scale absmax / 127 each, values rounded to int8;
    # the reference is gguf's own numpy port of llama.cpp's quantizer, run on the HF copy's weights.
    quants = gguf_package().quants
    q8_0 = gguf_package().GGMLQuantizationType.Q8_0
    exact = load_model(gguf_tiny / "hf").state_dict()
    quantized = load_model(gguf_tiny / "model-q8_0.gguf").state_dict()
    for name, weight in exact.items():
        if name == "lm_head.weight":
            continue
        if weight.dim() == 1 or gguf_tensor_name(name) == "position_embd.weight":  # stored F32 by the converter
            assert torch.equal(quantized[name], weight), name
            continue
        rounded = quants.dequantize(quants.quantize(weight.numpy(), q8_0), q8_0)
        assert np.array_equal(quantized[name].numpy(), rounded), name
        step = weight.reshape(-1, 32).abs().amax(dim=1, keepdim=True) / 127
        assert bool(((quantized[name].reshape(-1, 32) - weight.reshape(-1, 32)).abs() <= 0.6 * step).all()), name


@pytest.mark.parametrize("file", ["model-f32.gguf", "model-q8_0.gguf"])
@pytest.mark.slow
def test_greedy_text_is_llama_cpps(gguf_tiny: Path, file: str) -> None:
    llm = LLM.load(gguf_tiny / file)  # the tokenizer comes from the file's metadata
    assert llm.generate("The quick brown fox", SamplingParams(max_tokens=12, temperature=0)) == [LLAMA_CPP_GREEDY]


@pytest.mark.slow
def test_the_tokenizer_in_a_gguf_gives_gpt2s_ids(gguf_tiny: Path) -> None:
    from_gguf = load_tokenizer(gguf_tiny / "model-f32.gguf")
    reference = load_tokenizer(gguf_tiny / "hf")
    assert from_gguf.vocab_size == reference.vocab_size == 50257
    for text in TEXTS:
        assert from_gguf.encode(text) == reference.encode(text)
        assert from_gguf.encode(text, allowed_special="all") == reference.encode(text, allowed_special="all")


@pytest.mark.slow
def test_gpt2_sample_reads_a_gguf_file(gguf_tiny: Path, capsys) -> None:
    status = main(["sample", "--model", str(gguf_tiny / "model-q8_0.gguf"), "--prompt", "The quick brown fox",
                   "--max-new-tokens", "12", "--temperature", "0"])  # fmt: skip
    assert status == 0
    assert LLAMA_CPP_GREEDY in capsys.readouterr().out


def test_a_broken_gguf_file_is_one_clear_error(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "model.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    assert main(["sample", "--model", str(broken), "--prompt", "x"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a readable GGUF file" in err and "Traceback" not in err


def test_a_gguf_of_another_architecture_is_refused_by_name(tmp_path: Path) -> None:
    gguf = gguf_package()
    path = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'llama' model, not GPT-2"):
        load_model(path)


def test_without_the_gguf_package_the_error_names_the_extra(gguf_tiny: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"gpt2-faithful\[gguf\]"):
        load_model(gguf_tiny / "model-f32.gguf")
