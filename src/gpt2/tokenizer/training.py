"""Training a GPT-2 style byte-level BPE vocabulary on your own text (`train_tokenizer`).

The merges are learned by Hugging Face `tokenizers`' BpeTrainer (tiktoken has no trainer), then renumbered so
ids follow merge order: the result is an ordinary `Tokenizer` whose saved files any GPT-2 BPE implementation
reads, tiktoken included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import cast

from gpt2.tokenizer.bpe import EOT_TEXT, Tokenizer
from gpt2.tokenizer.reference import bytes_to_unicode, gpt2_byte_order, unicode_to_bytes

TRAINING_CHUNK_CHARS = 1 << 16  # texts reach the trainer in pieces this size, so its threads share the work


def _iter_training_files(paths: Iterable[Path], pattern: str) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            files = sorted(file for file in path.rglob(pattern) if file.is_file())
            if not files:
                raise FileNotFoundError(f"directory {str(path)!r} holds no files matching {pattern!r}")
            yield from files
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"training input {str(path)!r} does not exist")


def _training_chunks(texts: Iterable[str]) -> Iterator[str]:
    """Cut texts at line ends into pieces of about TRAINING_CHUNK_CHARS (the trainer reads files by lines too)."""
    for text in texts:
        start = 0
        while start < len(text):
            end = text.find("\n", start + TRAINING_CHUNK_CHARS)
            end = len(text) if end < 0 else end + 1
            yield text[start:end]
            start = end


def train_tokenizer(
    texts: Iterable[str] | str | os.PathLike | Iterable[os.PathLike],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    file_pattern: str = "*",
) -> Tokenizer:
    """Train a GPT-2 style byte-level BPE tokenizer: 256 bytes, `vocab_size - 257` merges, `<|endoftext|>` last.

    `texts` is an iterable of strings (the text itself), or paths (`pathlib.Path`) to files or directories
    (searched recursively for `file_pattern`, read as UTF-8 with invalid bytes replaced). Ids follow merge
    order, so the saved files work with any GPT-2 BPE implementation, tiktoken included.

    >>> tok = train_tokenizer(["def f(x): return x " * 50], vocab_size=260)  # or [Path("corpus.txt")]
    >>> tok.vocab_size, tok.decode(tok.encode("def f(x):"))
    (260, 'def f(x):')
    >>> sorted(path.name for path in tok.save(tmp / "my-tokenizer").iterdir())  # both OpenAI's and HF's names
    ['encoder.json', 'merges.txt', 'vocab.bpe', 'vocab.json']
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"vocab_size={vocab_size} is too small: 256 byte ids + <|endoftext|> need at least 257")
    # one text or one path, not an iterable of characters
    items: list[str | os.PathLike] = [texts] if isinstance(texts, (str, os.PathLike)) else list(texts)
    paths = [Path(item) for item in items if isinstance(item, os.PathLike)]
    if paths and len(paths) != len(items):
        raise ValueError("train_tokenizer: pass either strings of text or paths, not a mix")
    documents: Iterable[str]
    if paths:
        files = list(_iter_training_files(paths, file_pattern))
        documents = (file.read_text(encoding="utf-8", errors="replace") for file in files)
    else:
        documents = cast(list[str], items)

    model = HFTokenizer(models.BPE())
    # GPT-2's own split regex, bytes spelled in GPT-2's alphabet, no prefix space: same pieces as encode()
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,  # the last id is reserved for <|endoftext|>
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    model.train_from_iterator(_training_chunks(documents), trainer=trainer)
    trained = json.loads(model.to_str())["model"]
    merges: list[tuple[str, str]] = []
    for merge in trained["merges"]:  # "a b" strings from tokenizers < 0.20, ["a", "b"] pairs from newer ones
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        merges.append((left, right))

    # renumber so ids follow merge order: bytes in GPT-2's order, merge results by first appearance, then EOT
    alphabet = bytes_to_unicode()
    vocab = {alphabet[byte]: token_id for token_id, byte in enumerate(gpt2_byte_order())}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    if len(vocab) != vocab_size - 1:
        raise ValueError(
            f"the training text supports only {len(vocab) + 1} tokens (pairs seen at least min_frequency="
            f"{min_frequency} times ran out), not vocab_size={vocab_size}; give more text or a smaller vocab_size"
        )
    vocab[EOT_TEXT] = len(vocab)
    assert set(unicode_to_bytes()) <= set(vocab)
    return Tokenizer(vocab, merges, source="train_tokenizer")
