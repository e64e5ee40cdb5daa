"""gpt2: GPT-2, the real thing, in PyTorch."""

from gpt2.config import GPTConfig
from gpt2.model import GPT, GPTOutput, KVCache

__all__ = ["GPT", "GPTConfig", "GPTOutput", "KVCache"]
