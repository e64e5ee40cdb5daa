"""The tokenizer stored in a GGUF file's metadata, as llama.cpp's converter writes GPT-2's: `tokenizer.ggml.model =
gpt2` (byte-level BPE), the tokens spelled in GPT-2's printable byte alphabet (as in vocab.json), and the merges as
"left right" in rank order. Tokens of type UNUSED (rows of a model wider than its tokenizer) are left out."""

from __future__ import annotations

import os
from pathlib import Path

from gpt2.runtime.gguf import gguf_field, gguf_package, open_gguf
from gpt2.tokenizer.bpe import Tokenizer


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The byte-level BPE tokenizer of a GGUF file (ids = the file's token ids)."""
    reader = open_gguf(path)
    model = gguf_field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"{path} holds a {model or 'missing'!r} tokenizer, not GPT-2's byte-level BPE ('gpt2'); "
            "pass --tokenizer DIR_OR_NAME"
        )
    tokens = gguf_field(reader, "tokenizer.ggml.tokens", [])
    types = gguf_field(reader, "tokenizer.ggml.token_type", [])
    merges = gguf_field(reader, "tokenizer.ggml.merges", [])
    unused, control = int(gguf_package().TokenType.UNUSED), int(gguf_package().TokenType.CONTROL)
    vocab = {token: index for index, (token, kind) in enumerate(zip(tokens, types, strict=True)) if kind != unused}
    specials = [token for token, kind in zip(tokens, types, strict=True) if kind == control]
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    return Tokenizer(vocab, pairs, special_tokens=specials, source=str(Path(path)))
