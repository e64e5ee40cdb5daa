"""Inference: sampling parameters, generation with a KV cache, CPU inference layouts."""

from gpt2.inference.layouts import Int8Linear, SplitLinear, optimize_for_inference, quantize_int8

__all__ = ["Int8Linear", "SplitLinear", "optimize_for_inference", "quantize_int8"]
