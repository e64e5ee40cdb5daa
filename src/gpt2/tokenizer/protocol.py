"""The one tokenizer interface the rest of the package programs against.

`gpt2.tokenizer.Tokenizer` (GPT-2's byte-level BPE) and `gpt2.tokenizer.ByteTokenizer` both satisfy it; data
preparation, evaluation, generation, training and the facade accept any object that does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable


class StreamDecoder(Protocol):
    """Token ids in, text out, one id at a time, never half a character (see `Tokenizer.stream_decoder`)."""

    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


@runtime_checkable
class TextTokenizer(Protocol):
    """What every consumer of a tokenizer may rely on."""

    kind: str
    """A short name of the scheme ('byte-level-bpe', 'bytes')."""
    identity: str
    """A fingerprint of the vocabulary: equal identities encode every text to the same ids."""

    @property
    def eot_token(self) -> int:
        """The id of <|endoftext|>, which separates documents."""
        ...

    @property
    def vocab_size(self) -> int: ...

    def __len__(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Ordinary text -> ids; special-token text is refused unless the implementation is told to allow it."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def decode_bytes(self, ids: Sequence[int]) -> bytes: ...

    def stream_decoder(self) -> StreamDecoder: ...

    def save(self, directory: str | Path) -> Path: ...
