"""Export: our GPT-2 in the files other runtimes read. GGUF for llama.cpp (llamacpp.py), llm.c's checkpoint and
tokenizer (llmc.py), the Hugging Face directory (hf.py), ONNX for ONNX Runtime and transformers.js (onnx.py);
`export_model` (formats.py) picks one."""

from gpt2.export.formats import DTYPE_ALIASES, FORMATS, ExportFormat, ExportResult, export_dtype, export_model
from gpt2.export.hf import export_hf
from gpt2.export.llamacpp import export_gguf, gguf_tensor_name, gguf_vocabulary
from gpt2.export.llmc import export_llmc, padded_vocab_size, write_llmc_tokenizer
from gpt2.export.onnx import PastKeyValuesDecoder, export_onnx, onnx_input_names, onnx_output_names

__all__ = [
    "DTYPE_ALIASES",
    "FORMATS",
    "PastKeyValuesDecoder",
    "ExportFormat",
    "ExportResult",
    "export_dtype",
    "export_gguf",
    "export_hf",
    "export_llmc",
    "export_model",
    "export_onnx",
    "gguf_tensor_name",
    "gguf_vocabulary",
    "onnx_input_names",
    "onnx_output_names",
    "padded_vocab_size",
    "write_llmc_tokenizer",
]
