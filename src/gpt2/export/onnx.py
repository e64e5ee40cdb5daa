"""ONNX: the decoder with past key values, in the layout Hugging Face Optimum and transformers.js use for GPT-2,
so ONNX Runtime (Python, web, mobile) and transformers.js run it as they run `Xenova/gpt2`.

    out/
      config.json  generation_config.json  tokenizer.json  tokenizer_config.json  vocab.json  merges.txt ...
      onnx/model.onnx            fp32
      onnx/model_quantized.onnx  int8 weights (ONNX Runtime's quantize_dynamic), written with --dtype int8

One graph serves the prompt and every decoding step (Optimum's "merged" decoder): the first call passes past
tensors with 0 positions.

| inputs | shape | outputs | shape |
|---|---|---|---|
| input_ids (int64) | (B, T) | logits | (B, T, V) |
| attention_mask (int64) | (B, P + T), 1 = token, 0 = padding | present.{i}.key | (B, nh, P + T, hs) |
| position_ids (int64) | (B, T) | present.{i}.value | (B, nh, P + T, hs) |
| past_key_values.{i}.key / .value | (B, nh, P, hs) | | |

The graph is traced by torch's own exporter (`torch.onnx.export(..., dynamo=True)`) from `GPT.forward`, so it
computes what our model computes; tests/test_onnx.py checks the logits and a cached greedy continuation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import torch
import torch.nn as nn

from gpt2.export.common import check_tokenizer_fits, unwrap
from gpt2.export.hf_tokenizer import write_hf_runtime_files
from gpt2.model import GPT, KVCache
from gpt2.runtime.files import atomic_directory
from gpt2.tokenizer.protocol import TextTokenizer

ONNX_DTYPES = ("f32", "int8")
ONNX_OPSET = 18  # the dynamo exporter's default; ONNX Runtime >= 1.14 and onnxruntime-web run it
ONNX_FOLDER = "onnx"  # transformers.js looks for <model folder>/onnx/model.onnx
ONNX_FILES = {"f32": "model.onnx", "int8": "model_quantized.onnx"}  # transformers.js's names per dtype
# Sizes of the example inputs the exporter traces with. Any value > 1 works: torch.export specialises sizes 0 and
# 1, and every dimension is exported as symbolic (past 0 included, checked by the tests).
_EXAMPLE_BATCH, _EXAMPLE_NEW, _EXAMPLE_PAST = 2, 3, 4


def onnx_input_names(n_layer: int) -> list[str]:
    """input_ids, attention_mask, position_ids, then past_key_values.{i}.key / .value for each layer.

    >>> onnx_input_names(1)
    ['input_ids', 'attention_mask', 'position_ids', 'past_key_values.0.key', 'past_key_values.0.value']
    """
    past = [f"past_key_values.{i}.{kind}" for i in range(n_layer) for kind in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past]


def onnx_output_names(n_layer: int) -> list[str]:
    """logits, then present.{i}.key / .value for each layer.

    >>> onnx_output_names(1)
    ['logits', 'present.0.key', 'present.0.value']
    """
    return ["logits", *(f"present.{i}.{kind}" for i in range(n_layer) for kind in ("key", "value"))]


class PastKeyValuesDecoder(nn.Module):
    """`GPT.forward` with the cache passed in and out as tensors, the signature the ONNX graph has.

    Each layer's past keys and values are extended by T empty positions; the model writes the T new positions into
    them, and the filled tensors are the `present` outputs. So the exported graph runs our own attention, masks
    and position handling, not a second implementation of them.
    """

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = unwrap(model)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        """input_ids, position_ids: (B, T); attention_mask: (B, P + T); past_key_values: 2 * n_layer tensors
        (B, nh, P, hs), key then value per layer -> (logits (B, T, V), 2 * n_layer present tensors)."""
        config = self.model.config
        B, T = input_ids.shape
        past = past_key_values[0].shape[2]
        fresh = past_key_values[0].new_zeros(B, config.n_head, T, config.head_dim)  # filled by the model
        keys = [torch.cat([tensor, fresh], dim=2) for tensor in past_key_values[0::2]]  # n_layer x (B, nh, P+T, hs)
        values = [torch.cat([tensor, fresh], dim=2) for tensor in past_key_values[1::2]]
        # The model reads the cache only as `kv_cache.k[layer]`, so a list of per-layer tensors serves as well as
        # the stacked (n_layer, ...) tensor and keeps every layer's write to its own tensor: written into a view
        # of one stacked tensor, each layer's write exports as a scatter over all layers' caches, which made
        # ONNX Runtime's decode steps several times slower.
        cache = KVCache(cast(torch.Tensor, keys), cast(torch.Tensor, values), past)
        logits = self.model(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, kv_cache=cache, validate=False
        ).logits
        present = [tensor for layer in range(config.n_layer) for tensor in (keys[layer], values[layer])]
        return (logits, *present)


def export_onnx(
    model: GPT, tokenizer: TextTokenizer, directory: str | os.PathLike[str], *, dtype: str = "f32"
) -> list[Path]:
    """Write `model` as ONNX into `directory` (see the module docstring for the layout) with its tokenizer and
    config files beside it; dtype 'f32' writes onnx/model.onnx, 'int8' onnx/model_quantized.onnx as well.
    Nothing half-written is ever left at `directory`. Needs the `onnx` extra (onnx, onnxscript, onnxruntime).

    Returns the model files written.
    """
    if dtype not in ONNX_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not available for ONNX; choose one of {', '.join(ONNX_DTYPES)}")
    require_onnx_packages(quantize=dtype == "int8")
    model = unwrap(model)
    check_tokenizer_fits(model, tokenizer)
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"--out {directory} is a file; the ONNX format is a directory")
    with atomic_directory(directory) as staging:
        (staging / ONNX_FOLDER).mkdir()
        fp32 = staging / ONNX_FOLDER / ONNX_FILES["f32"]
        write_onnx_graph(model, fp32)
        written = [fp32]
        if dtype == "int8":
            written.append(quantize_int8(fp32, staging / ONNX_FOLDER / ONNX_FILES["int8"]))
        write_hf_runtime_files(staging, model.config, tokenizer)
    return [directory / path.relative_to(staging) for path in written]


def write_onnx_graph(model: GPT, path: Path) -> None:
    """Trace `model` with torch's exporter and write the fp32 graph, weights inside, to `path`."""
    config = model.config
    n_past = 2 * config.n_layer
    B, T, P = _EXAMPLE_BATCH, _EXAMPLE_NEW, _EXAMPLE_PAST
    if P + T > config.block_size:
        raise ValueError(f"block_size {config.block_size} is too small to export; it must be at least {P + T}")
    parameter = next(model.parameters())
    example = (
        torch.zeros(B, T, dtype=torch.long),
        torch.ones(B, P + T, dtype=torch.long),
        torch.arange(P, P + T).expand(B, T).contiguous(),
        [torch.zeros(B, config.n_head, P, config.head_dim) for _ in range(n_past)],
    )
    batch = torch.export.Dim("batch_size")
    new = torch.export.Dim("sequence_length", max=config.block_size)
    past = torch.export.Dim("past_sequence_length", min=0, max=config.block_size)
    total = torch.export.Dim("total_sequence_length", max=config.block_size)
    dynamic_shapes = {
        "input_ids": {0: batch, 1: new},
        "attention_mask": {0: batch, 1: total},
        "position_ids": {0: batch, 1: new},
        "past_key_values": [{0: batch, 2: past}] * n_past,
    }
    decoder = PastKeyValuesDecoder(model).eval()
    original = (parameter.device, parameter.dtype, model.training)
    model.to(device="cpu", dtype=torch.float32)
    try:
        with _quiet_exporter(), torch.no_grad():
            program = torch.onnx.export(
                decoder,
                example,
                input_names=onnx_input_names(config.n_layer),
                output_names=onnx_output_names(config.n_layer),
                dynamic_shapes=dynamic_shapes,
                opset_version=ONNX_OPSET,
                dynamo=True,
                optimize=True,
                verbose=False,
            )
        assert program is not None
        program.save(str(path))
    finally:
        model.to(device=original[0], dtype=original[1]).train(original[2])


def quantize_int8(source: Path, path: Path) -> Path:
    """ONNX Runtime's dynamic quantization: int8 weights for MatMul/Gemm, activations quantized at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_exporter():
        quantize_dynamic(source, path, weight_type=QuantType.QInt8)
    return path


def require_onnx_packages(*, quantize: bool = False) -> None:
    """One clear error (a ValueError, which the CLI prints as one line) naming the extra when the exporter's
    packages are missing."""
    needed = ["onnx", "onnxscript"] + (["onnxruntime"] if quantize else [])
    missing = [name for name in needed if not _importable(name)]
    if missing:
        raise ValueError(
            f"exporting ONNX needs {', '.join(missing)}; install them with: pip install 'gpt2-faithful[onnx]'"
        )


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's and quantizer's progress lines and internal warnings are not for our users: silence them
    for the call. The root logger gets a handler meanwhile, so a library's `logging.warning` cannot install
    `basicConfig`'s stderr handler behind our back."""
    names = ["torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir", ""]
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    root, silent = logging.getLogger(), logging.NullHandler()
    root.addHandler(silent)
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        root.removeHandler(silent)
