"""Inference: the sampling parameters, logits processors, and generation with a KV cache (the CPU runtime it
decodes on where it can is gpt2.cpu)."""

from gpt2.inference.generation import DecodeOptions, generate, generate_texts, left_pad, stream, stream_text
from gpt2.inference.processors import LogitsProcessor, build_processors
from gpt2.inference.sampling import SamplingParams, filter_top_k, filter_top_p, sample_next_token

__all__ = [
    "DecodeOptions",
    "LogitsProcessor",
    "build_processors",
    "SamplingParams",
    "filter_top_k",
    "filter_top_p",
    "generate",
    "generate_texts",
    "left_pad",
    "sample_next_token",
    "stream",
    "stream_text",
]
