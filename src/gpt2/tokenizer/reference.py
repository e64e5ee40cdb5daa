"""GPT-2 byte-level BPE in plain Python: the readable specification the fast engine is tested against.

The algorithm, as OpenAI's 2019 `encoder.py` runs it:

1. Split the text into pieces with GPT-2's regex (contractions, optional-space + letters, optional-space +
   digits, optional-space + other symbols, whitespace runs). BPE never merges across two pieces.
2. Turn each piece into its UTF-8 bytes, and each byte into one printable character (`bytes_to_unicode`), so
   the vocabulary files can be plain JSON/text: byte 0x20 (space) is written `Ġ`, 0x0A (newline) `Ċ`.
3. Repeatedly merge the adjacent pair that appears earliest in the merges list, until no pair is listed.
4. Look each resulting symbol up in the vocabulary to get its id.

Decoding is the reverse: ids -> symbols -> bytes -> UTF-8 (invalid sequences replaced, never raised).

This module is deliberately slow and obvious; `gpt2.tokenizer` holds the fast engine and the file formats.
"""

from __future__ import annotations

from functools import cache

import regex

# GPT-2's pre-tokenizer pattern, verbatim from OpenAI's encoder.py (case-sensitive: "'S" is not a contraction).
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@cache
def bytes_to_unicode() -> dict[int, str]:
    """Map each byte 0..255 to a printable character, as GPT-2's vocabulary files spell bytes.

    Bytes that are already printable and not whitespace map to themselves; the other 68 (control characters,
    space, 0x7F-0xA0, soft hyphen) are shifted to 256, 257, ... so that no symbol is invisible.
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


@cache
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of `bytes_to_unicode`."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def gpt2_byte_order() -> list[int]:
    """The byte values in the order GPT-2 gives them ids 0..255 (printable bytes first, then the rest)."""
    return list(bytes_to_unicode())


def symbol_to_bytes(symbol: str) -> bytes:
    """Turn a vocabulary symbol such as 'Ġworld' back into its bytes (b' world')."""
    table = unicode_to_bytes()
    return bytes(table[char] for char in symbol)


def split_pieces(text: str) -> list[str]:
    """Step 1: the pre-tokenizer. BPE runs on each piece separately."""
    return regex.findall(GPT2_SPLIT_PATTERN, text)


class ReferenceBPE:
    """Byte-level BPE over a vocabulary {symbol: id} and an ordered list of merges (pairs of symbols).

    `special_tokens` maps texts such as '<|endoftext|>' to ids; they are used only where `encode` is told to.

    >>> from gpt2.tokenizer.files import read_merges, read_vocab
    >>> bpe = ReferenceBPE(read_vocab(gpt2_files / "encoder.json"), read_merges(gpt2_files / "vocab.bpe"))
    >>> bpe.encode("Hello world")
    [15496, 995]
    """

    def __init__(
        self, vocab: dict[str, int], merges: list[tuple[str, str]], special_tokens: dict[str, int] | None = None
    ) -> None:
        self.vocab = vocab
        self.id_to_symbol = {token_id: symbol for symbol, token_id in vocab.items()}
        # rank = position in the merges list; a pair listed twice keeps its first (strongest) rank
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, pair in enumerate(merges):
            self.ranks.setdefault(pair, rank)
        self.special_tokens = dict(special_tokens or {})
        self._cache: dict[str, list[str]] = {}

    def bpe(self, piece_symbols: str) -> list[str]:
        """Step 3: merge one piece (already in byte symbols) down to vocabulary symbols."""
        if piece_symbols in self._cache:
            return self._cache[piece_symbols]
        parts = list(piece_symbols)
        while len(parts) > 1:
            pairs = [(parts[i], parts[i + 1]) for i in range(len(parts) - 1)]
            best = min(pairs, key=lambda pair: self.ranks.get(pair, float("inf")))
            if best not in self.ranks:
                break
            # merge every occurrence of the best pair, left to right, as OpenAI's encoder.py does
            merged: list[str] = []
            i = 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self._cache[piece_symbols] = parts
        return parts

    def encode_ordinary(self, text: str) -> list[int]:
        """Steps 1-4, treating every character as text (special-token strings included)."""
        table = bytes_to_unicode()
        ids: list[int] = []
        for piece in split_pieces(text):
            symbols = "".join(table[byte] for byte in piece.encode("utf-8"))
            ids.extend(self.vocab[symbol] for symbol in self.bpe(symbols))
        return ids

    def encode(self, text: str, allowed_special: frozenset[str] = frozenset()) -> list[int]:
        """Encode, turning the special-token texts in `allowed_special` into their ids."""
        if not allowed_special:
            return self.encode_ordinary(text)
        pattern = "|".join(regex.escape(token) for token in sorted(allowed_special, key=len, reverse=True))
        ids: list[int] = []
        start = 0
        for match in regex.finditer(pattern, text):
            ids.extend(self.encode_ordinary(text[start : match.start()]))
            ids.append(self.special_tokens[match.group()])
            start = match.end()
        ids.extend(self.encode_ordinary(text[start:]))
        return ids

    def decode_bytes(self, ids: list[int]) -> bytes:
        """Ids -> bytes; special ids become their text."""
        specials = {token_id: text for text, token_id in self.special_tokens.items()}
        out = bytearray()
        for token_id in ids:
            if token_id in specials:
                out += specials[token_id].encode("utf-8")
            else:
                out += symbol_to_bytes(self.id_to_symbol[token_id])
        return bytes(out)

    def decode(self, ids: list[int]) -> str:
        """Ids -> text, with invalid UTF-8 replaced by U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
