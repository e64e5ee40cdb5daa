"""Tokenizers: GPT-2's byte-level BPE (tiktoken engine), the byte tokenizer, BPE training, one loader."""

from gpt2.tokenizer.core import *  # noqa: F403  (temporary: split by job below)
from gpt2.tokenizer.core import TIKTOKEN_SPLIT_PATTERN  # noqa: F401
