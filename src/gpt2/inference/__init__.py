"""Inference: the sampling parameters, generation with a KV cache, and the CPU inference layouts."""

from gpt2.inference.generation import DecodeOptions, generate, left_pad, stream, stream_text
from gpt2.inference.layouts import (
    Int4Linear,
    Int8Linear,
    SplitLinear,
    optimize_for_inference,
    prepare_for_inference,
    quantize_int4,
    quantize_int8,
)
from gpt2.inference.processors import LogitsProcessor, build_processors
from gpt2.inference.sampling import SamplingParams, filter_top_k, filter_top_p, sample_next_token

__all__ = [
    "DecodeOptions",
    "LogitsProcessor",
    "build_processors",
    "Int4Linear",
    "Int8Linear",
    "SamplingParams",
    "SplitLinear",
    "filter_top_k",
    "filter_top_p",
    "generate",
    "left_pad",
    "optimize_for_inference",
    "prepare_for_inference",
    "quantize_int4",
    "quantize_int8",
    "sample_next_token",
    "stream",
    "stream_text",
]
