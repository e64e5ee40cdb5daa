"""GGUF, the file llama.cpp runs: our GPT-2 as llama.cpp's `gpt2` architecture loads it.

What goes in, as llama.cpp's own converter (convert_hf_to_gguf.py) writes a GPT2LMHeadModel:

- metadata: `general.architecture = gpt2`, `general.type`, `general.name`, `general.size_label`,
  `gpt2.{block_count, context_length, embedding_length, feed_forward_length, attention.head_count,
  attention.layer_norm_epsilon}`, `general.file_type`, `general.quantization_version`;
- the tokenizer: `tokenizer.ggml.model = gpt2` (byte-level BPE), `pre = gpt-2` (GPT-2's split pattern), the
  tokens spelled in GPT-2's printable byte alphabet (as in vocab.json), their types (special tokens CONTROL,
  ids the tokenizer lacks `[PAD{id}]` UNUSED), the merges as "left right", and bos = eos = unknown = <|endoftext|>;
- the tensors under llama.cpp's names (`TENSOR_NAMES`). A GGUF tensor stored as a numpy array (out, in) is
  ggml's {in, out}: exactly nn.Linear's [out, in], so our weights go in untransposed.

Types: f32 writes everything as F32. f16, bf16 and q8_0 convert the 2-D weights and the token embedding; biases,
norms (1-D) and the position embedding stay F32, as the converter keeps them (llama.cpp's kernels expect
that). q8_0 needs rows that are a multiple of 32 values; a weight whose rows are not falls back to F16, as
in the converter. q4_0 (llama.cpp's most used 4-bit type: blocks of 32 weights, one f16 scale each, through the
gguf package's quantizer) applies to the blocks' 2-D weights; the token embedding, which is also the output
layer, stays q8_0 (`FOUR_BIT_KEEPS_Q8_0`).

q4_k (llama.cpp's k-quant Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32, each sub-block a 6-bit scale
and minimum; our quantizer, gpt2.export.kquants) also applies to the blocks' 2-D weights, with the token
embedding at q8_0. The file type is MOSTLY_Q4_K_S: `llama-quantize ... Q4_K_S` likewise makes the blocks' weights
Q4_K, except the first eighth of the layers' ffn_down (Q5_K), and the output layer Q6_K; we have neither Q5_K nor
Q6_K, so those ffn_down stay Q4_K and the output layer takes q8_0 (more bits than Q6_K). Not Q4_K_M: that gives the
fused attention weights Q5_K and half the ffn_down Q6_K. A weight whose rows are not a multiple of 256 values (a
tiny model's width) takes q5_0 instead, as llama-quantize falls back from Q4_K, and F16 where its rows are not
whole 32-value blocks either.

Needs the `gguf` package (llama.cpp's own reader/writer): `pip install 'gpt2-faithful[gguf]'`.
The names and the reader are in gpt2.weights.gguf (`load_model` reads these files back).

>>> from gpt2 import GPT, GPTConfig
>>> from gpt2.tokenizer import load_tokenizer
>>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=50257))
>>> export_gguf(model, load_tokenizer(gpt2_files), tmp / "gpt2-f16.gguf", dtype="f16").name
'gpt2-f16.gguf'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from gpt2.export.common import check_tokenizer_fits, float32_tensors, unwrap
from gpt2.export.kquants import QK_K, quantize_q4_k
from gpt2.model import GPT
from gpt2.runtime.files import atomic_output
from gpt2.runtime.gguf import gguf_package
from gpt2.tokenizer import Tokenizer
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights.gguf import ARCHITECTURE, BLOCK_TENSOR_NAMES, gguf_tensor_name

GGUF_DTYPES = ("f16", "f32", "bf16", "q8_0", "q4_0", "q4_k")  # the converter's default first

# Tensors that stay F32 whatever the file type (besides every 1-D tensor): llama.cpp's converter keeps them so.
ALWAYS_F32 = ("position_embd.weight",)
# q4_0 and q4_k keep the token embedding, which GPT-2 also uses as its output layer, at 8 bits: llama-quantize gives
# the output layer more bits than the rest for the same reason (its error reaches every logit directly).
FOUR_BIT_KEEPS_Q8_0 = ("token_embd.weight", "output.weight")


def _gguf() -> Any:
    return gguf_package()


def _file_types(gguf: Any) -> dict[str, tuple[Any, Any]]:
    """dtype name -> (general.file_type, the type given to quantizable tensors)."""
    file_type, quant = gguf.LlamaFileType, gguf.GGMLQuantizationType
    return {
        "f32": (file_type.ALL_F32, quant.F32),
        "f16": (file_type.MOSTLY_F16, quant.F16),
        "bf16": (file_type.MOSTLY_BF16, quant.BF16),
        "q8_0": (file_type.MOSTLY_Q8_0, quant.Q8_0),
        "q4_0": (file_type.MOSTLY_Q4_0, quant.Q4_0),
        "q4_k": (file_type.MOSTLY_Q4_K_S, quant.Q4_K),
    }


def gguf_vocabulary(tokenizer: TextTokenizer, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) for `vocab_size` ids, as llama.cpp's `gpt2` tokenizer reads them."""
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError(
            f"GGUF export needs a byte-level BPE tokenizer (llama.cpp's 'gpt2' tokenizer); this model uses the "
            f"{getattr(tokenizer, 'kind', type(tokenizer).__name__)!r} tokenizer, which llama.cpp cannot express "
            "(export it with --format llmc or hf instead)"
        )
    gguf = _gguf()
    symbol_of_id = {token_id: symbol for symbol, token_id in tokenizer.vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for token_id in range(vocab_size):
        symbol = symbol_of_id.get(token_id)
        if symbol is None:  # a model wider than its tokenizer: rows no text ever produces
            tokens.append(f"[PAD{token_id}]")
            types.append(int(gguf.TokenType.UNUSED))
        else:
            tokens.append(symbol)
            is_special = symbol in tokenizer.special_tokens
            types.append(int(gguf.TokenType.CONTROL if is_special else gguf.TokenType.NORMAL))
    merges = [f"{left} {right}" for left, right in tokenizer.merges]
    if not merges:
        raise ValueError("the tokenizer has no merges; llama.cpp's 'gpt2' tokenizer needs at least one")
    return tokens, types, merges


def export_gguf(
    model: GPT,
    tokenizer: TextTokenizer,
    path: str | os.PathLike[str],
    *,
    dtype: str = "f16",
    name: str | None = None,
) -> Path:
    """Write `model` and its tokenizer as one GGUF file llama.cpp loads (`llama-cli -m PATH`).

    dtype: one of GGUF_DTYPES (see the module docstring for which tensors it applies to).
    name: `general.name` (default: the file's stem). The file appears only once complete.
    """
    if dtype not in GGUF_DTYPES:
        raise ValueError(f"GGUF dtype {dtype!r} is not supported; choose one of {', '.join(GGUF_DTYPES)}")
    gguf = _gguf()
    model = unwrap(model)
    check_tokenizer_fits(model, tokenizer)
    config = model.config
    path = Path(path)
    tokens, token_types, merges = gguf_vocabulary(tokenizer, config.vocab_size)
    file_type, wanted = _file_types(gguf)[dtype]
    four_bit = (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_K)

    writer = gguf.GGUFWriter(None, ARCHITECTURE)
    for our_name, array in _llamacpp_order(float32_tensors(model)):
        gguf_name = gguf_tensor_name(our_name)
        qtype = wanted
        if array.ndim <= 1 or gguf_name.endswith("_norm.weight") or gguf_name in ALWAYS_F32:
            qtype = gguf.GGMLQuantizationType.F32
        elif qtype in four_bit and gguf_name in FOUR_BIT_KEEPS_Q8_0:
            qtype = gguf.GGMLQuantizationType.Q8_0
        qtype, data = _quantize(gguf, array, qtype)
        writer.add_tensor(gguf_name, data, raw_dtype=qtype)

    # metadata in the order llama.cpp's converter writes it
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or path.stem)
    writer.add_size_label(gguf.size_label(*writer.get_total_parameter_count()))
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.block_size)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)  # GPT-2's MLP is 4x the width
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_eps)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    try:
        eot = tokenizer.eot_token
    except ValueError:
        eot = None  # a tokenizer without <|endoftext|>: llama.cpp then has no bos/eos
    if eot is not None:
        writer.add_bos_token_id(eot)
        writer.add_eos_token_id(eot)
        writer.add_unk_token_id(eot)

    return write_gguf(writer, path)


def _quantize(gguf: Any, array: np.ndarray, qtype: Any) -> tuple[Any, np.ndarray]:
    """(the type written, the data) of `array` as `qtype`, or as the type llama-quantize falls back to where its
    rows do not fit: Q4_K -> Q5_0 (rows not a multiple of 256), then anything -> F16 (not whole 32-value blocks)."""
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        if array.shape[-1] % QK_K == 0:
            return qtype, quantize_q4_k(array)
        qtype = gguf.GGMLQuantizationType.Q5_0
    try:
        return qtype, gguf.quants.quantize(array, qtype)
    except gguf.QuantError:  # q8_0 / q5_0 / q4_0 on rows that are not whole 32-value blocks
        return gguf.GGMLQuantizationType.F16, gguf.quants.quantize(array, gguf.GGMLQuantizationType.F16)


def write_gguf(writer: Any, path: Path) -> Path:
    """Write a filled `gguf.GGUFWriter` to `path`, which appears only once complete; returns it."""
    with atomic_output(path) as temporary:
        try:
            writer.write_header_to_file(temporary)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return path


def _llamacpp_order(arrays: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Embeddings, then block by block, then the final norm (and an untied head): the order llama.cpp creates
    them in, which makes a file easy to read in a dump."""
    n_layer = 1 + max((int(name.split(".")[2]) for name in arrays if name.startswith("transformer.h.")), default=-1)
    head = ["transformer.wte.weight", "transformer.wpe.weight"]
    blocks = [
        f"transformer.h.{layer}.{module}.{leaf}"
        for layer in range(n_layer)
        for module in BLOCK_TENSOR_NAMES
        for leaf in ("weight", "bias")
    ]
    tail = ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]
    ordered = [name for name in head + blocks + tail if name in arrays]
    leftovers = sorted(set(arrays) - set(ordered))
    if leftovers:
        raise ValueError(f"tensors {leftovers} have no place in llama.cpp's GPT-2 layout")
    return [(name, arrays[name]) for name in ordered]
