"""gpt2: GPT-2, the real thing, in PyTorch.

The short way in is the facade, `LLM.load(model_dir_or_name)`; the parts it joins are exported here too.
"""

from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams, generate
from gpt2.model import GPT, GPTOutput, KVCache
from gpt2.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer, train_tokenizer
from gpt2.weights import load_model, save_pretrained

__all__ = [
    "GPT",
    "LLM",
    "ByteTokenizer",
    "GPTConfig",
    "GPTOutput",
    "KVCache",
    "SamplingParams",
    "Tokenizer",
    "generate",
    "load_model",
    "load_tokenizer",
    "save_pretrained",
    "train_tokenizer",
]
