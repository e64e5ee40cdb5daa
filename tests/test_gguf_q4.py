"""q4_0 GGUF export: the file llama.cpp's gguf reader describes (MOSTLY_Q4_0, the blocks' weights Q4_0, the token
embedding / output layer Q8_0), read back by us close to the float model, and, opt-in, run by llama.cpp's own
binary with the same greedy text as ours from the same file (set GPT2_LLAMA_CPP_BIN to llama.cpp's build/bin)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import shared_file
from gpt2.api import LLM
from gpt2.cli import main
from gpt2.inference import SamplingParams

gguf = pytest.importorskip("gguf")
LLAMA_CPP_BIN = "GPT2_LLAMA_CPP_BIN"
PROMPT = "The cat sat on"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return shared_file("fixtures/gguf-tiny/model-f32.gguf").parent / "hf"


@pytest.fixture(scope="module")
def q4_file(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("q4") / "tiny-q4_0.gguf"
    assert main(["export", "--model", str(model_dir), "--format", "gguf", "--dtype", "q4_0", "--out", str(out)]) == 0
    return out


def test_q4_0_file_is_what_llamacpps_reader_expects(q4_file):
    reader = gguf.GGUFReader(q4_file)
    assert reader.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    types = {tensor.name: tensor.tensor_type for tensor in reader.tensors}
    Q = gguf.GGMLQuantizationType
    assert types["blk.0.attn_qkv.weight"] == types["blk.1.ffn_down.weight"] == Q.Q4_0
    assert types["token_embd.weight"] == Q.Q8_0
    assert types["position_embd.weight"] == types["blk.0.attn_norm.weight"] == Q.F32


def test_q4_0_logits_stay_near_the_float_models(q4_file, model_dir):
    ids = torch.tensor([[464, 3797, 3332, 319, 262, 2603]])
    with torch.no_grad():
        full = LLM.load(model_dir, device="cpu").model(ids).logits
        quantized = LLM.load(q4_file, device="cpu").model(ids).logits
    error = (quantized - full).abs().max() / full.abs().max()
    assert 0 < error < 0.25, error  # 4-bit weights: changed, not broken


def greedy(q4_file: Path) -> str:
    llm = LLM.load(q4_file, device="cpu")
    return PROMPT + llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0))[0]


@pytest.mark.skipif(not os.environ.get(LLAMA_CPP_BIN), reason=f"set {LLAMA_CPP_BIN} to llama.cpp's build/bin")
def test_llamacpp_runs_the_q4_0_file_with_our_greedy_text(q4_file):
    simple = Path(os.environ[LLAMA_CPP_BIN]) / "llama-simple"
    done = subprocess.run([str(simple), "-m", str(q4_file), "-n", "20", PROMPT], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == greedy(q4_file)
