"""Tokenizers: GPT-2's byte-level BPE (tiktoken engine), the byte tokenizer, BPE training, one loader.

Where each thing lives: `protocol` (the TextTokenizer interface), `bpe` (Tokenizer), `byte` (ByteTokenizer),
`files` (the vocabulary files on disk), `training` (train_tokenizer), `loading` (load_tokenizer), `reference`
(the plain-Python BPE the fast engine is tested against).
"""

from gpt2.tokenizer.bpe import EOT_TEXT, TIKTOKEN_SPLIT_PATTERN, StreamDecoder, Tokenizer
from gpt2.tokenizer.byte import ByteTokenizer
from gpt2.tokenizer.files import BYTE_TOKENIZER_FILE, HF_FILES, OPENAI_FILES, TOKENIZER_JSON
from gpt2.tokenizer.loading import BYTE_TOKENIZER_NAMES, load_tokenizer
from gpt2.tokenizer.protocol import AllowedSpecial, TextTokenizer
from gpt2.tokenizer.training import train_tokenizer

__all__ = [
    "BYTE_TOKENIZER_FILE",
    "BYTE_TOKENIZER_NAMES",
    "EOT_TEXT",
    "HF_FILES",
    "OPENAI_FILES",
    "TIKTOKEN_SPLIT_PATTERN",
    "TOKENIZER_JSON",
    "AllowedSpecial",
    "ByteTokenizer",
    "StreamDecoder",
    "TextTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "train_tokenizer",
]
