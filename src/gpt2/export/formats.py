"""The export formats in one table, and `export_model`, the one entry point the CLI calls.

| format | writes | dtypes (default first) | read by |
|---|---|---|---|
| gguf | one `.gguf` file | f16, f32, bf16, q8_0, q4_0, q4_k | llama.cpp (`llama-cli -m`), anything built on it |
| gguf-lora | one `.gguf` file: a LoRA adapter for the model | f16, f32 | llama.cpp (`llama-cli -m BASE --lora`) |
| llmc | the `.bin` checkpoint + `gpt2_tokenizer.bin` beside it | f32, bf16 | karpathy/llm.c's trainers |
| hf | a directory: config.json, model.safetensors, tokenizer | f32 | transformers, `gpt2.api.LLM.load` |
| onnx | a directory: onnx/model.onnx (+ model_quantized.onnx), tokenizer | f32, int8 | ORT, transformers.js |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpt2.export.gguf_lora import GGUF_LORA_DTYPES, export_gguf_lora
from gpt2.export.hf import HF_DTYPES, export_hf
from gpt2.export.llamacpp import GGUF_DTYPES, export_gguf
from gpt2.export.llmc import LLMC_DTYPES, export_llmc
from gpt2.export.llmc import TOKENIZER_FILE as LLMC_TOKENIZER_FILE
from gpt2.export.onnx import ONNX_DTYPES, ONNX_FILES, export_onnx
from gpt2.model import GPT
from gpt2.tokenizer.protocol import TextTokenizer


@dataclass(frozen=True)
class ExportFormat:
    name: str
    dtypes: tuple[str, ...]
    """The dtypes this format can store, its default first."""
    description: str


FORMATS: dict[str, ExportFormat] = {
    "gguf": ExportFormat("gguf", GGUF_DTYPES, "llama.cpp's GGUF file"),
    "gguf-lora": ExportFormat("gguf-lora", GGUF_LORA_DTYPES, "llama.cpp's GGUF LoRA adapter (of --adapter)"),
    "llmc": ExportFormat("llmc", LLMC_DTYPES, "karpathy/llm.c's checkpoint and tokenizer files"),
    "hf": ExportFormat("hf", HF_DTYPES, "Hugging Face directory (safetensors) with the tokenizer"),
    "onnx": ExportFormat("onnx", ONNX_DTYPES, "ONNX decoder with past key values (ONNX Runtime, transformers.js)"),
}
# Other spellings people use for the same dtypes.
DTYPE_ALIASES = {
    "float32": "f32", "fp32": "f32", "float16": "f16", "fp16": "f16", "half": "f16", "bfloat16": "bf16",
    "qint8": "int8", "q8": "int8",
}  # fmt: skip


def export_dtype(format: str, dtype: str | None = None) -> str:
    """The dtype `format` will be written in: `dtype` in its canonical spelling, or the format's default.

    >>> export_dtype("llmc", "bfloat16")
    'bf16'
    >>> export_dtype("gguf")
    'f16'
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    allowed = FORMATS[format].dtypes
    if dtype is None:
        return allowed[0]
    canonical = DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if canonical not in allowed:
        raise ValueError(f"--dtype {dtype} is not available for --format {format}; choose one of {', '.join(allowed)}")
    return canonical


@dataclass(frozen=True)
class ExportResult:
    """What `export_model` wrote."""

    format: str
    dtype: str
    paths: tuple[Path, ...]

    def dtype_of(self, path: Path) -> str:
        """The dtype `path` holds: the export's, except ONNX's fp32 graph written beside an int8 one."""
        if self.format == "onnx":
            return {name: dtype for dtype, name in ONNX_FILES.items()}.get(path.name, self.dtype)
        return self.dtype


def export_targets(format: str, out: str | os.PathLike[str]) -> list[Path]:
    """The paths an export in `format` at `out` writes over: `out` itself, and for llmc the tokenizer file
    beside it."""
    out = Path(out)
    return [out, out.parent / LLMC_TOKENIZER_FILE] if format == "llmc" else [out]


def refuse_existing_output(format: str, out: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """Raise FileExistsError naming the first file or non-empty folder an export at `out` would replace, unless
    `overwrite`; an empty folder counts as free."""
    if overwrite:
        return
    for path in export_targets(format, out):
        if path.is_dir() and not any(path.iterdir()):
            continue
        if path.exists() or path.is_symlink():
            kind = "folder" if path.is_dir() else "file"
            raise FileExistsError(
                f"{path} already exists ({kind}); pass --overwrite to replace it, or choose another --out"
            )


def export_model(
    model: GPT,
    tokenizer: TextTokenizer,
    format: str,
    out: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    name: str | None = None,
    adapter: str | os.PathLike[str] | None = None,
) -> ExportResult:
    """Write `model` with its tokenizer in `format` ('gguf', 'llmc', 'hf' or 'onnx') at `out` (a file for gguf and
    llmc, a directory for hf and onnx). dtype: see `FORMATS` (None: the format's default). name: the model's name
    where the format records one (GGUF's general.name). adapter: for 'gguf-lora', the LoRA adapter's folder (PEFT's
    format) to write for `model`. Nothing half-written is ever left at `out`."""
    dtype = export_dtype(format, dtype)
    if format == "gguf-lora":
        if adapter is None:
            raise ValueError("--format gguf-lora writes a LoRA adapter: pass its folder with --adapter DIR")
        paths = [export_gguf_lora(model.config, adapter, out, dtype=dtype, name=name)]
    elif format == "gguf":
        paths = [export_gguf(model, tokenizer, out, dtype=dtype, name=name)]
    elif format == "llmc":
        paths = export_llmc(model, out, dtype=dtype, tokenizer=tokenizer)
    elif format == "onnx":
        paths = export_onnx(model, tokenizer, out, dtype=dtype)
    else:
        paths = [export_hf(model, tokenizer, out)]
    return ExportResult(format, dtype, tuple(paths))
