"""The byte tokenizer (`ByteTokenizer`): ids 0..255 are the UTF-8 bytes, 256 is `<|endoftext|>`.

For tiny models, where a 50k-row embedding would dwarf the network. Same interface as `Tokenizer`
(`gpt2.tokenizer.protocol.TextTokenizer`); `load_tokenizer("bytes")` makes one, and a saved one
(byte_tokenizer.json) loads back from its directory.

>>> tok = ByteTokenizer()
>>> tok.encode("hé"), tok.decode([104, 195, 169])
([104, 195, 169], 'hé')
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from gpt2.tokenizer.bpe import EOT_TEXT, StreamDecoder, check_ids, resolve_allowed
from gpt2.tokenizer.files import check_byte_tokenizer_file, write_byte_tokenizer_file
from gpt2.tokenizer.protocol import AllowedSpecial


class ByteTokenizer:
    """The simplest tokenizer: ids 0..255 are the UTF-8 bytes, 256 is `<|endoftext|>` (vocab_size 257)."""

    kind = "bytes"
    vocab_size = 257
    eot_token = 256

    def __init__(self) -> None:
        self.special_tokens = {EOT_TEXT: self.eot_token}
        self.identity = f"{self.kind}:sha256:{hashlib.sha256(b'utf-8 bytes 0-255; <|endoftext|>=256').hexdigest()}"

    @classmethod
    def from_file(cls, path: str | Path) -> ByteTokenizer:
        """Load the byte_tokenizer.json `save` wrote (checks the file describes this tokenizer)."""
        check_byte_tokenizer_file(Path(path), cls._description())
        return cls()

    @classmethod
    def _description(cls) -> dict[str, object]:
        """What byte_tokenizer.json holds: enough to refuse a file written for another byte tokenizer."""
        return {"kind": cls.kind, "vocab_size": cls.vocab_size, "eot_token": cls.eot_token, "format_version": 1}

    def save(self, directory: str | Path) -> Path:
        """Write byte_tokenizer.json into `directory`, which `load_tokenizer(directory)` recognises."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_byte_tokenizer_file(directory, self._description())
        return directory

    def encode(self, text: str, *, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Text -> its UTF-8 bytes; `<|endoftext|>` becomes 256 only if allowed."""
        if allowed_special and resolve_allowed(allowed_special, self.special_tokens):
            ids: list[int] = []
            for index, part in enumerate(text.split(EOT_TEXT)):
                if index:
                    ids.append(self.eot_token)
                ids.extend(part.encode("utf-8"))
            return ids
        return list(text.encode("utf-8"))

    def encode_batch(
        self, texts: Sequence[str], *, allowed_special: AllowedSpecial = frozenset(), num_threads: int | None = None
    ) -> list[list[int]]:
        """Encode many texts. Runs on one thread whatever `num_threads` says: the work is a C-speed copy."""
        return [self.encode(text, allowed_special=allowed_special) for text in texts]

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Ids -> raw bytes; 256 becomes the text `<|endoftext|>`."""
        check_ids(ids, self.vocab_size)
        if self.eot_token not in ids:
            return bytes(ids)
        return b"".join(EOT_TEXT.encode() if token_id == self.eot_token else bytes([token_id]) for token_id in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        """A decoder fed one id at a time that never splits a character (see `StreamDecoder`)."""
        return StreamDecoder(lambda token_id: self.decode_bytes([token_id]))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=257)"
