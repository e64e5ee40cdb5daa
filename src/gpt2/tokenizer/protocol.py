"""The one tokenizer interface the rest of the package programs against.

`gpt2.tokenizer.Tokenizer` (GPT-2's byte-level BPE) and `gpt2.tokenizer.ByteTokenizer` both satisfy it
(tests/test_tokenizer.py checks every signature); data preparation, evaluation, generation, training and the
facade accept any object that does.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

# Which special-token texts `encode` turns into their ids: a set of texts such as {'<|endoftext|>'}, or 'all'.
AllowedSpecial = Set[str] | Literal["all"]


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

    def encode(self, text: str, *, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Text -> ids. A special-token text such as '<|endoftext|>' in the input is ordinary text (encoded
        character by character) unless it is listed in `allowed_special` (or that is 'all'); naming a special
        token the tokenizer does not have is a ValueError."""
        ...

    def encode_batch(
        self, texts: Sequence[str], *, allowed_special: AllowedSpecial = frozenset(), num_threads: int | None = None
    ) -> list[list[int]]:
        """`encode` on each text, possibly on `num_threads` threads (an implementation may use fewer)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        ...

    def decode_bytes(self, ids: Sequence[int]) -> bytes: ...

    def stream_decoder(self) -> StreamDecoder: ...

    def save(self, directory: str | Path) -> Path:
        """Write the files `gpt2.tokenizer.load_tokenizer(directory)` reads back; return the directory."""
        ...
