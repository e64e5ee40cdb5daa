"""`load_tokenizer`: the one way to get a tokenizer from a name, a directory or a Hub name.

>>> load_tokenizer("bytes")
ByteTokenizer(vocab_size=257)
>>> tok = load_tokenizer(gpt2_files)  # encoder.json + vocab.bpe, or vocab.json + merges.txt
>>> tok.encode("Hello world")
[15496, 995]
"""

from __future__ import annotations

import os
from pathlib import Path

from gpt2.runtime.gguf import is_gguf
from gpt2.tokenizer.bpe import Tokenizer
from gpt2.tokenizer.byte import ByteTokenizer
from gpt2.tokenizer.files import (
    BYTE_TOKENIZER_FILE,
    HF_FILES,
    OPENAI_FILES,
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    read_tokenizer_json,
)
from gpt2.tokenizer.gguf import load_gguf_tokenizer
from gpt2.weights.hub import resolve_pretrained

BYTE_TOKENIZER_NAMES = ("bytes", "byte")  # what `load_tokenizer` reads as "the plain byte tokenizer"


def load_tokenizer(spec: str | os.PathLike[str]) -> Tokenizer | ByteTokenizer:
    """'bytes' (or 'byte') -> ByteTokenizer(); a GGUF file -> the tokenizer in its metadata; anything else names a
    directory, or a Hub name such as 'gpt2' (fetched by `gpt2.weights.hub.resolve_pretrained` when online).

    The directory may hold, in order of preference: a saved `ByteTokenizer` (byte_tokenizer.json), OpenAI's
    encoder.json + vocab.bpe, Hugging Face's vocab.json + merges.txt, or a tokenizer.json. FileNotFoundError
    when it holds none of them (or only half of a pair), naming the files it looked for.
    """
    if str(spec) in BYTE_TOKENIZER_NAMES:
        return ByteTokenizer()
    if is_gguf(Path(spec).expanduser()):
        return load_gguf_tokenizer(Path(spec).expanduser())
    directory = resolve_pretrained(os.fspath(spec), allow_patterns=TOKENIZER_FILES)
    if (directory / BYTE_TOKENIZER_FILE).is_file():
        return ByteTokenizer.from_file(directory / BYTE_TOKENIZER_FILE)
    for vocab_name, merges_name in (OPENAI_FILES, HF_FILES):
        if (directory / vocab_name).is_file() or (directory / merges_name).is_file():
            return Tokenizer.from_files(directory / vocab_name, directory / merges_name)
    if (directory / TOKENIZER_JSON).is_file():
        vocab, merges, specials = read_tokenizer_json(directory / TOKENIZER_JSON)
        return Tokenizer(vocab, merges, special_tokens=specials, source=str(directory / TOKENIZER_JSON))
    raise FileNotFoundError(
        f"{str(directory)!r} holds no tokenizer: expected encoder.json + vocab.bpe, vocab.json + merges.txt, "
        f"{TOKENIZER_JSON}, or {BYTE_TOKENIZER_FILE}"
    )
