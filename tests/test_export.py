"""Export: the files we write are the files llama.cpp's and llm.c's own tools write for the same weights.

References (shared fixtures, see their READMEs): `gguf-tiny/` holds a tiny real-vocabulary GPT-2 in HF format
and the GGUFs llama.cpp's convert_hf_to_gguf.py wrote from it (f32, q8_0); `llmc-tiny/` holds the files llm.c's
train_gpt2.py `write_model` wrote from `hf-tiny/`.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_file
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.export import (
    export_dtype,
    export_gguf,
    export_hf,
    export_llmc,
    export_model,
    gguf_tensor_name,
    padded_vocab_size,
    write_llmc_tokenizer,
)
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from gpt2.tokenizer.reference import bytes_to_unicode
from gpt2.weights import load_llmc, load_model, save_pretrained

# sha256 of gpt2_tokenizer.bin for GPT-2's vocabulary, recorded by running llm.c's own `write_tokenizer`
# (train_gpt2.py, commit f1e2ace) on a tiktoken Encoding built from the shared gpt2-bpe files: 372,108 bytes.
LLMC_GPT2_TOKENIZER_SHA256 = "6f3abc21e444e4e8300e225f4e03da48ea121cf17e30f67009b8dad7a66c2f13"
LLMC_GPT2_TOKENIZER_BYTES = 372_108


@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_tiny() -> Path:
    return shared_file("fixtures/gguf-tiny/model-f32.gguf").parent


@pytest.fixture(scope="module")
def tiny_model(gguf_tiny: Path) -> GPT:
    """n_layer 2, n_head 4, n_embd 32, n_ctx 64 with GPT-2's 50257-token vocabulary (see the fixture's README)."""
    return load_model(gguf_tiny / "hf")


@pytest.fixture(scope="module")
def gpt2_tokenizer(gguf_tiny: Path):
    return load_tokenizer(gguf_tiny / "hf")


@pytest.fixture(scope="module")
def small_tokenizer() -> Tokenizer:
    """The 256 byte symbols, one merge and <|endoftext|>: for tests where the vocabulary does not matter (reading
    back GGUF's 50257 tokens and 50000 merges takes seconds)."""
    vocab = {symbol: token_id for token_id, symbol in enumerate(bytes_to_unicode().values())}
    vocab["Ġt"] = 256  # "Ġt" = " t"
    vocab["<|endoftext|>"] = 257
    return Tokenizer(vocab, [("Ġ", "t")])


@functools.cache
def read_gguf(path: Path) -> tuple[dict, dict]:
    """(metadata {key: value}, tensors {name: ReaderTensor}) of a GGUF file; read once per test session."""
    import gguf

    reader = gguf.GGUFReader(path)
    metadata = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    return metadata, {tensor.name: tensor for tensor in reader.tensors}


@pytest.fixture(scope="module")
def tiny_gguf(gguf, tiny_model, gpt2_tokenizer, tmp_path_factory) -> Callable[[str], Path]:
    """dtype -> our GGUF export of the gguf-tiny model (written once per dtype)."""
    folder = tmp_path_factory.mktemp("gguf")

    @functools.cache
    def export(dtype: str) -> Path:
        return export_gguf(tiny_model, gpt2_tokenizer, folder / f"ours-{dtype}.gguf", dtype=dtype)

    return export


def dequantized(gguf, tensor) -> np.ndarray:
    """A GGUF tensor's values as float32, in numpy order (rows = ggml's last dimension)."""
    return gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(tuple(reversed(tensor.shape)))


# ------------------------------------------------------------------------------------------------------ GGUF
@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
@pytest.mark.slow
def test_gguf_has_the_metadata_and_tokenizer_llamacpp_converter_writes(gguf_tiny, tiny_gguf, dtype):
    ours, _ = read_gguf(tiny_gguf(dtype))
    theirs, _ = read_gguf(gguf_tiny / f"model-{dtype}.gguf")
    assert list(ours) == list(theirs)  # the same keys, in the converter's order
    assert ours["general.name"] == f"ours-{dtype}"  # the converter names it after its input folder; we the file
    for key in theirs:
        if key != "general.name":
            assert ours[key] == theirs[key], key
    assert ours["general.architecture"] == "gpt2"
    assert ours["tokenizer.ggml.model"] == "gpt2" and ours["tokenizer.ggml.pre"] == "gpt-2"
    assert len(ours["tokenizer.ggml.tokens"]) == 50257 and len(ours["tokenizer.ggml.merges"]) == 50000
    assert ours["tokenizer.ggml.tokens"][50256] == "<|endoftext|>" and ours["tokenizer.ggml.token_type"][50256] == 3
    assert ours["tokenizer.ggml.eos_token_id"] == 50256


@pytest.mark.slow
def test_gguf_f32_tensors_equal_llamacpp_converter_output(gguf, gguf_tiny, tiny_gguf):
    _, ours = read_gguf(tiny_gguf("f32"))
    _, theirs = read_gguf(gguf_tiny / "model-f32.gguf")
    assert sorted(ours) == sorted(theirs)
    assert "output.weight" not in ours  # tied head: llama.cpp reuses token_embd
    for name, reference in theirs.items():
        assert ours[name].tensor_type == reference.tensor_type == gguf.GGMLQuantizationType.F32, name
        assert list(ours[name].shape) == list(reference.shape), name
        assert np.array_equal(np.asarray(ours[name].data), np.asarray(reference.data)), name


@pytest.mark.slow
def test_gguf_q8_0_tensors_match_llamacpp_converter_output(gguf, gguf_tiny, tiny_gguf):
    _, ours = read_gguf(tiny_gguf("q8_0"))
    _, theirs = read_gguf(gguf_tiny / "model-q8_0.gguf")
    assert sorted(ours) == sorted(theirs)
    quantized = [name for name, tensor in theirs.items() if tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0]
    assert sorted(quantized) == sorted(
        ["token_embd.weight"] + [f"blk.{i}.{n}.weight" for i in range(2) for n in
                                 ("attn_qkv", "attn_output", "ffn_up", "ffn_down")]
    )  # fmt: skip
    for name, reference in theirs.items():
        assert ours[name].tensor_type == reference.tensor_type, name
        assert list(ours[name].shape) == list(reference.shape), name
        if np.array_equal(np.asarray(ours[name].data), np.asarray(reference.data)):
            continue
        # else the same values up to q8_0 rounding: one quantization step (block max / 127) at most
        mine, theirs_values = dequantized(gguf, ours[name]), dequantized(gguf, reference)
        step = np.abs(theirs_values).reshape(-1, 32).max(axis=1) / 127
        assert np.all(np.abs(mine - theirs_values).reshape(-1, 32) <= step[:, None] * 1.01), name


@pytest.mark.parametrize("dtype, stored", [("f16", "F16"), ("bf16", "BF16")])
def test_gguf_half_precision_holds_the_weights_within_rounding(gguf, small_tokenizer, tmp_path, dtype, stored):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=300, block_size=16, n_layer=2, n_head=2, n_embd=64))
    _, tensors = read_gguf(export_gguf(model, small_tokenizer, tmp_path / "m.gguf", dtype=dtype))
    weights = {gguf_tensor_name(name): p.detach() for name, p in model.state_dict().items() if name != "lm_head.weight"}
    assert sorted(tensors) == sorted(weights)
    for name, weight in weights.items():
        kept_f32 = weight.dim() == 1 or name == "position_embd.weight"
        assert tensors[name].tensor_type.name == ("F32" if kept_f32 else stored), name
        values = torch.from_numpy(dequantized(gguf, tensors[name]).copy())
        if kept_f32:
            assert torch.equal(values, weight), name
        else:  # exactly the nearest half-precision value of each weight
            rounded = weight.to(torch.float16 if dtype == "f16" else torch.bfloat16).float()
            assert torch.equal(values, rounded), name


def test_gguf_lists_ids_beyond_the_tokenizer_as_unused_padding(gguf, small_tokenizer, tmp_path):
    model = GPT(GPTConfig(vocab_size=384, block_size=16, n_layer=1, n_head=2, n_embd=32))
    metadata, tensors = read_gguf(export_gguf(model, small_tokenizer, tmp_path / "m.gguf", dtype="f32"))
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 384
    assert tokens[256:260] == ["\u0120t", "<|endoftext|>", "[PAD258]", "[PAD259]"]
    assert types[255:260] == [1, 1, 3, 5, 5]  # NORMAL, NORMAL, CONTROL, UNUSED...
    assert set(types[258:]) == {5}
    assert metadata["tokenizer.ggml.merges"] == ["\u0120 t"]
    assert list(tensors["token_embd.weight"].shape) == [32, 384]


def test_gguf_writes_an_untied_head_as_output_weight(gguf, small_tokenizer, tmp_path):
    model = GPT(GPTConfig(vocab_size=258, block_size=8, n_layer=1, n_head=2, n_embd=32))
    model.lm_head.weight = torch.nn.Parameter(torch.randn(258, 32))
    _, tensors = read_gguf(export_gguf(model, small_tokenizer, tmp_path / "m.gguf", dtype="f32"))
    assert np.array_equal(np.asarray(tensors["output.weight"].data), model.lm_head.weight.detach().numpy())


def test_gguf_q8_0_falls_back_to_f16_for_rows_that_are_not_whole_blocks(gguf, small_tokenizer, tmp_path):
    model = GPT(GPTConfig(vocab_size=258, n_embd=48, n_head=2, n_layer=1, block_size=8))  # 48: not a multiple of 32
    _, tensors = read_gguf(export_gguf(model, small_tokenizer, tmp_path / "m.gguf", dtype="q8_0"))
    assert tensors["blk.0.attn_qkv.weight"].tensor_type.name == "F16"
    assert tensors["blk.0.ffn_down.weight"].tensor_type.name == "Q8_0"  # rows of 4 * 48 = 192 values


def test_gguf_writes_zero_biases_for_a_model_without_them(gguf, small_tokenizer, tmp_path):
    model = GPT(GPTConfig(vocab_size=258, block_size=8, n_layer=1, n_head=2, n_embd=32, bias=False))
    _, tensors = read_gguf(export_gguf(model, small_tokenizer, tmp_path / "m.gguf", dtype="f32"))
    assert not np.asarray(tensors["blk.0.attn_qkv.bias"].data).any()  # llama.cpp requires every GPT-2 bias
    assert list(tensors["blk.0.ffn_up.bias"].shape) == [128]


def test_gguf_refuses_a_tokenizer_llamacpp_cannot_express(gguf, tmp_path):
    model = GPT(GPTConfig(vocab_size=257, block_size=8, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match="byte-level BPE tokenizer"):
        export_gguf(model, ByteTokenizer(), tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_gguf_refuses_a_tokenizer_larger_than_the_model(gguf, gpt2_tokenizer, tmp_path):
    model = GPT(GPTConfig(vocab_size=512, block_size=8, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match="the tokenizer has 50257 tokens but the model only 512"):
        export_gguf(model, gpt2_tokenizer, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_gguf_export_leaves_no_file(gguf, small_tokenizer, tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", crash)
    model = GPT(GPTConfig(vocab_size=258, block_size=8, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(OSError, match="disk full"):
        export_gguf(model, small_tokenizer, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------------ llm.c
@pytest.mark.parametrize("dtype, filename", [("f32", "model_fp32.bin"), ("bf16", "model_bf16.bin")])
def test_llmc_model_file_is_byte_identical_to_llmc_write_model(fixtures_dir, tmp_path, dtype, filename):
    model = load_model(fixtures_dir / "hf-tiny")
    (path,) = export_llmc(model, tmp_path / filename, dtype=dtype)
    assert path.read_bytes() == (fixtures_dir / "llmc-tiny" / filename).read_bytes()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_llmc_export_round_trips_through_load_llmc(fixtures_dir, tmp_path, dtype):
    model = load_model(fixtures_dir / "hf-tiny")
    (path,) = export_llmc(model, tmp_path / "model.bin", dtype=dtype)
    back = load_llmc(path)
    assert back.config.vocab_size == model.config.vocab_size and back.config.n_layer == model.config.n_layer
    for name, weight in model.state_dict().items():
        expected = weight if dtype == "f32" else weight.to(torch.bfloat16).float()
        assert torch.equal(back.state_dict()[name], expected), name


def test_llmc_pads_the_vocabulary_with_zero_rows_to_a_multiple_of_128(tiny_model, gpt2_tokenizer, tmp_path):
    model_path, tokenizer_path = export_llmc(tiny_model, tmp_path / "gpt2.bin", tokenizer=gpt2_tokenizer)
    assert tokenizer_path == tmp_path / "gpt2_tokenizer.bin"
    raw = model_path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[:8].tolist() == [20240326, 3, 64, 50257, 2, 4, 32, 50304]
    assert not header[8:].any()
    wte = np.frombuffer(raw[1024 : 1024 + 50304 * 32 * 4], dtype="<f4").reshape(50304, 32)
    assert np.array_equal(wte[:50257], tiny_model.transformer.wte.weight.detach().numpy())
    assert not wte[50257:].any()
    assert torch.equal(load_llmc(model_path).transformer.wte.weight, tiny_model.transformer.wte.weight)


def test_llmc_header_names_the_tokenizers_vocabulary_when_the_model_is_wider(gpt2_tokenizer, tmp_path):
    model = GPT(GPTConfig(vocab_size=50304, block_size=8, n_layer=1, n_head=2, n_embd=32))
    model_path, _ = export_llmc(model, tmp_path / "wide.bin", tokenizer=gpt2_tokenizer)
    header = np.frombuffer(model_path.read_bytes()[:32], dtype="<i4")
    assert header[3] == 50257 and header[7] == 50304  # V: what llm.c samples from; Vp: the rows stored


def test_llmc_tokenizer_file_is_what_llmc_write_tokenizer_writes(gpt2_tokenizer, tmp_path):
    data = write_llmc_tokenizer(gpt2_tokenizer, tmp_path / "gpt2_tokenizer.bin").read_bytes()
    assert len(data) == LLMC_GPT2_TOKENIZER_BYTES
    assert hashlib.sha256(data).hexdigest() == LLMC_GPT2_TOKENIZER_SHA256


def test_llmc_tokenizer_file_lists_every_tokens_bytes(tmp_path):
    data = write_llmc_tokenizer(ByteTokenizer(), tmp_path / "tok.bin").read_bytes()
    header = np.frombuffer(data[:1024], dtype="<i4")
    assert header[:4].tolist() == [20240328, 2, 257, 256]
    tokens, position = [], 1024
    while position < len(data):
        length = data[position]
        tokens.append(data[position + 1 : position + 1 + length])
        position += 1 + length
    assert tokens == [bytes([b]) for b in range(256)] + [b"<|endoftext|>"]


def test_llmc_refuses_an_unknown_dtype(fixtures_dir, tmp_path):
    with pytest.raises(ValueError, match="llm.c dtype 'f16' is not supported"):
        export_llmc(load_model(fixtures_dir / "hf-tiny"), tmp_path / "m.bin", dtype="f16")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("vocab_size, padded", [(512, 512), (50257, 50304), (257, 384), (128, 128)])
def test_padded_vocab_size_rounds_up_to_a_multiple_of_128(vocab_size, padded):
    assert padded_vocab_size(vocab_size) == padded


# --------------------------------------------------------------------------------------------------------- HF
@pytest.mark.slow
def test_hf_export_reads_back_as_the_same_model_and_tokenizer(tiny_model, gpt2_tokenizer, tmp_path):
    out = export_hf(tiny_model, gpt2_tokenizer, tmp_path / "run")
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= {p.name for p in out.iterdir()}
    back = load_model(out)
    assert all(torch.equal(back.state_dict()[name], w) for name, w in tiny_model.state_dict().items())
    assert load_tokenizer(out).identity == gpt2_tokenizer.identity
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging folder left behind


def test_hf_export_into_an_existing_directory_replaces_its_files(tiny_model, gpt2_tokenizer, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    (out / "config.json").write_text("{}")
    export_hf(tiny_model, gpt2_tokenizer, out)
    assert (out / "notes.txt").read_text() == "kept"
    assert load_model(out).config.vocab_size == 50257
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ------------------------------------------------------------------------------------------ dtypes and the CLI
@pytest.mark.parametrize(
    "format, dtype, expected",
    [("gguf", None, "f16"), ("gguf", "Q8_0", "q8_0"), ("gguf", "float32", "f32"), ("llmc", None, "f32"),
     ("llmc", "bfloat16", "bf16"), ("hf", None, "f32")],
)  # fmt: skip
def test_export_dtype_defaults_per_format_and_accepts_common_spellings(format, dtype, expected):
    assert export_dtype(format, dtype) == expected


@pytest.mark.parametrize("format, dtype", [("gguf", "q6_k"), ("llmc", "f16"), ("hf", "bf16")])
def test_export_dtype_refuses_what_a_format_cannot_store(format, dtype):
    with pytest.raises(ValueError, match=f"--dtype {dtype} is not available for --format {format}"):
        export_dtype(format, dtype)


def test_export_model_reports_what_it_wrote(fixtures_dir, tmp_path):
    model = load_model(fixtures_dir / "hf-tiny")
    result = export_model(model, ByteTokenizer(), "llmc", tmp_path / "m.bin", dtype="bfloat16")
    assert (result.format, result.dtype) == ("llmc", "bf16")
    assert result.paths == (tmp_path / "m.bin", tmp_path / "gpt2_tokenizer.bin")


def test_cli_exports_gguf_and_prints_the_file(gguf, small_tokenizer, tmp_path, capsys):
    run = tmp_path / "run1"
    save_pretrained(GPT(GPTConfig(vocab_size=258, block_size=8, n_layer=1, n_head=2, n_embd=32)), run)
    small_tokenizer.save(run)
    out = tmp_path / "run1-q8_0.gguf"
    assert main(["export", "--model", str(run), "--format", "gguf", "--dtype", "q8_0", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (gguf, q8_0, ")
    metadata, _ = read_gguf(out)
    assert metadata["general.name"] == "run1" and metadata["general.file_type"] == 7  # MOSTLY_Q8_0


@pytest.mark.slow
def test_cli_exports_llmc_files(gguf_tiny, tmp_path, capsys):
    assert main(["export", "--model", str(gguf_tiny / "hf"), "--format", "llmc", "--out", str(tmp_path / "m.bin")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in printed] == [f"wrote {tmp_path / 'm.bin'}",
                                                         f"wrote {tmp_path / 'gpt2_tokenizer.bin'}"]  # fmt: skip


def test_cli_bad_dtype_is_one_line_before_anything_loads(tmp_path, capsys):
    code = main(["export", "--model", str(tmp_path / "nowhere"), "--format", "llmc", "--dtype", "q8_0",
                 "--out", str(tmp_path / "m.bin")])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2
    expected = "--dtype q8_0 is not available for --format llmc; choose one of f32, bf16"
    assert captured.err == f"gpt2 export: error: {expected}\n"
    assert list(tmp_path.iterdir()) == []


def test_cli_model_tokenizer_mismatch_is_one_line(fixtures_dir, gguf_tiny, tmp_path, capsys):
    code = main(["export", "--model", str(fixtures_dir / "hf-tiny"), "--tokenizer", str(gguf_tiny / "hf"),
                 "--format", "hf", "--out", str(tmp_path / "out")])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.count("\n") == 1 and "the tokenizer has 50257 tokens but the model only 512" in captured.err
    assert not os.path.exists(tmp_path / "out")


def test_llmc_refuses_to_write_the_model_over_its_tokenizer_file(fixtures_dir, tmp_path):
    with pytest.raises(ValueError, match="where llm.c's tokenizer file goes"):
        export_llmc(load_model(fixtures_dir / "hf-tiny"), tmp_path / "gpt2_tokenizer.bin", tokenizer=ByteTokenizer())
    assert list(tmp_path.iterdir()) == []
