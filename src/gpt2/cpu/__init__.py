"""The CPU inference runtime: weight layouts for fast decoding (`prepare_for_inference`), the native C++ kernels
they use where those build (kernels.py, csrc/), and the native decode step (decoder.py)."""

from gpt2.cpu.layouts import (
    PRECISIONS,
    Int4Linear,
    Int8Linear,
    SplitLinear,
    optimize_for_inference,
    prepare_for_inference,
    quantize_int4,
    quantize_int8,
)

__all__ = [
    "PRECISIONS",
    "Int4Linear",
    "Int8Linear",
    "SplitLinear",
    "optimize_for_inference",
    "prepare_for_inference",
    "quantize_int4",
    "quantize_int8",
]
