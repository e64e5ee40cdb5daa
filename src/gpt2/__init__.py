"""gpt2: GPT-2, the real thing, in PyTorch."""

from gpt2.config import GPTConfig
from gpt2.model import GPT, GPTOutput, KVCache
from gpt2.tokenizer import ByteTokenizer, Tokenizer, train_tokenizer

__all__ = ["GPT", "GPTConfig", "GPTOutput", "KVCache", "Tokenizer", "ByteTokenizer", "train_tokenizer"]
