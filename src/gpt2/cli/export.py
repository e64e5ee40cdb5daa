"""`gpt2 export`: write a model, with its tokenizer, in the files other runtimes read.

    gpt2 export --model out/run1 --format gguf --out run1-f16.gguf            # llama.cpp: llama-cli -m run1-f16.gguf
    gpt2 export --model gpt2 --format gguf --dtype q8_0 --out gpt2-q8_0.gguf
    gpt2 export --model out/run1 --format llmc --out llmc/run1.bin            # + llmc/gpt2_tokenizer.bin
    gpt2 export --model run1.bin --tokenizer gpt2 --format hf --out run1-hf
    gpt2 export --model gpt2 --format onnx --dtype int8 --out gpt2-onnx      # onnx/model.onnx + model_quantized.onnx
    gpt2 export --model gpt2 --format gguf-lora --adapter out/poems --out poems.gguf   # llama-cli -m ... --lora

Formats and dtypes (default first): gguf f16|f32|bf16|q8_0|q4_0|q4_k; gguf-lora f16|f32; llmc f32|bf16; hf f32; onnx
f32|int8 (ONNX Runtime, transformers.js; needs the onnx extra: pip install 'gpt2-faithful[onnx]'). --adapter: with
gguf-lora, the LoRA adapter (PEFT's format) written for the model; with the others, merged into the model first.
An existing --out (for llmc, also the gpt2_tokenizer.bin beside it) is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpt2.api import LLM
from gpt2.cli.common import add_adapter_argument, add_model_arguments
from gpt2.export import FORMATS, export_dtype, export_model
from gpt2.export.formats import refuse_existing_output
from gpt2.export.onnx import require_onnx_packages
from gpt2.finetune.lora import apply_adapter
from gpt2.runtime.files import disk_errors_named


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a model for llama.cpp (GGUF), llm.c, Hugging Face or ONNX",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--format", required=True, choices=list(FORMATS), help="what to write")
    parser.add_argument("--out", required=True, help="file to write (gguf, llmc) or directory (hf, onnx)")
    parser.add_argument(
        "--dtype", help="stored precision (default: f16 for gguf, f32 otherwise; float16 = f16, bfloat16 = bf16, ...)"
    )
    parser.add_argument("--name", help="model name recorded in the file (gguf; default: the model's folder name)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_adapter_argument(parser, "with gguf-lora, the adapter to write (NAME: its name in the file); else merged in")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    dtype = export_dtype(args.format, args.dtype)  # a wrong --dtype is reported before anything is loaded
    refuse_existing_output(args.format, args.out, overwrite=args.overwrite)  # so is an --out already there
    if args.format == "onnx":
        require_onnx_packages(quantize=dtype == "int8")  # so is a missing extra
    llm = LLM.load(args.model, tokenizer=args.tokenizer, device="cpu")
    model_path = Path(str(args.model).rstrip("/"))
    name = args.name or (model_path.stem if model_path.is_file() else model_path.name)
    adapter_name, adapter = args.adapter or (None, None)
    if args.format == "gguf-lora":
        name = args.name or adapter_name
    elif adapter:
        apply_adapter(llm.model, adapter)
    with disk_errors_named(args.out):
        result = export_model(llm.model, llm.tokenizer, args.format, args.out, dtype=dtype, name=name, adapter=adapter)
    for path in result.paths:
        print(f"wrote {path} ({result.format}, {result.dtype_of(path)}, {_size(path)})")
    return 0


def _size(path: Path) -> str:
    size = sum(item.stat().st_size for item in path.iterdir()) if path.is_dir() else path.stat().st_size
    return f"{size / 1e6:.1f} MB"
