"""GPT-2's byte-level BPE tokenizer (`Tokenizer`): a vocabulary and its merges, encoded by tiktoken's engine.

`Tokenizer` checks that vocabulary and merges belong together and encodes with tiktoken's Rust engine; the
files it is read from and written to are `gpt2.tokenizer.files`, and `gpt2.tokenizer.load_tokenizer` finds
them in a directory.

Why tiktoken (measured, see docs/performance.md "Tokenizer"): on tinyshakespeare x10 on a 2-core VM
tiktoken encodes ~12x faster single-threaded than the Hugging Face `tokenizers` engine behind
`GPT2TokenizerFast` (21 vs 1.7 MB/s), releases the GIL so a thread pool scales, and builds from local files with
no network.
Both give identical ids (tests/test_tokenizer.py pins that, and pins both against `gpt2.tokenizer.reference`,
the plain-Python specification of the algorithm). Training (`gpt2.tokenizer.training`) uses HF `tokenizers`'
BpeTrainer, which tiktoken lacks.

tiktoken merges by the rank of the merged token and uses rank == token id. That reproduces merges-file BPE only
when ids follow merge order (true of GPT-2's files and of everything `train_tokenizer` saves). For other
vocabularies the engine runs on ranks in merge order and the ids are translated back (`_RankTable`).
(tiktoken ranks the merged *string*, true BPE ranks the *pair*: they could differ where a token's string can also
be formed from a pair that is not its listed merge. The tests compare both with the reference on GPT-2's
vocabulary and on trained ones, and have found no disagreement.)

Special tokens: the text `<|endoftext|>` inside ordinary input is ordinary text (tokenized as characters);
it becomes id 50256 only where the caller passes `allowed_special`.

>>> from gpt2.tokenizer import load_tokenizer
>>> tok = load_tokenizer(gpt2_files)  # a folder with GPT-2's encoder.json and vocab.bpe
>>> tok.encode("Hello world")
[15496, 995]
>>> tok.encode("<|endoftext|>") == tok.encode("<|endoftext|>", allowed_special="all")
False
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tiktoken

from gpt2.tokenizer.files import read_merges, read_vocab, write_vocab_and_merges
from gpt2.tokenizer.protocol import AllowedSpecial
from gpt2.tokenizer.reference import bytes_to_unicode, symbol_to_bytes

EOT_TEXT = "<|endoftext|>"
# GPT-2's split pattern (reference.GPT2_SPLIT_PATTERN), spelled for speed in tiktoken's engine; the tests
# check that it splits every text as the original does. Why each change is safe and faster:
# - letters and numbers first: most pieces are words, and a contraction can only start at an apostrophe,
#   where neither of them matches, so trying it third never changes which alternative wins;
# - the four piece kinds in one group that the engine tries before the whitespace rules;
# - a lone `\s` last: `\s+(?!\S)` only fails on a single whitespace character before a non-space, which
#   is all the original's trailing `\s+` could then match.
# Faster than tiktoken's own GPT-2 spelling on code, prose and multilingual text (`gpt2 bench tokenizer --peer
# tiktoken`, docs/performance.md).
TIKTOKEN_SPLIT_PATTERN = r"""(?: ?\p{L}+| ?\p{N}+|'(?:[sdmt]|ll|ve|re)| ?[^\s\p{L}\p{N}]+)|\s+(?!\S)|\s"""
# What a vocabulary entry that no merge produces may look like to count as a special token.
SPECIAL_TOKEN_SHAPE = re.compile(r"<\|[^|]+\|>")
# encode_batch cuts the list into this many chunks per worker: one task per string (tiktoken's own batch
# API) drowns short strings in scheduling overhead; a few chunks per worker still balance uneven lengths.
CHUNKS_PER_WORKER = 4


class StreamDecoder:
    """Turns token ids into text one id at a time, holding back bytes of a character not yet complete.

    A character such as '🤗' (4 UTF-8 bytes) may be split over two or three tokens; `push` returns '' until
    the token that completes it arrives. Concatenating every `push` and the final `flush` gives exactly
    `decode(all ids)`, invalid bytes included (each replaced by U+FFFD).

    >>> from gpt2.tokenizer import load_tokenizer
    >>> tok = load_tokenizer(gpt2_files)
    >>> ids = tok.encode("a🤗")  # 'a', then the emoji's four bytes in three tokens
    >>> dec = tok.stream_decoder()
    >>> [dec.push(i) for i in ids] + [dec.flush()]
    ['a', '', '', '🤗', '']
    """

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        # Python's incremental UTF-8 decoder already buffers incomplete sequences and, with "replace",
        # replaces exactly what bytes.decode(errors="replace") would.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly '')."""
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: return what is held back (an incomplete sequence becomes U+FFFD) and reset."""
        rest = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return rest


def resolve_allowed(allowed_special: AllowedSpecial, special_tokens: dict[str, int]) -> frozenset[str]:
    """The special-token texts an `encode(..., allowed_special=...)` call turns into ids; ValueError for a
    text the tokenizer does not have, or a bare string other than 'all'."""
    if allowed_special == "all":
        return frozenset(special_tokens)
    if isinstance(allowed_special, str):
        raise ValueError(
            f"allowed_special={allowed_special!r}: pass a set of token texts such as "
            f"{{{EOT_TEXT!r}}}, or the string 'all'"
        )
    unknown = sorted(set(allowed_special) - set(special_tokens))
    if unknown:
        raise ValueError(
            f"allowed_special names {unknown}, which this tokenizer does not have; "
            f"its special tokens are {sorted(special_tokens)}"
        )
    return frozenset(allowed_special)


def check_ids(ids: Sequence[int], vocab_size: int) -> None:
    """ValueError naming the first id outside 0..vocab_size-1 (ids from another tokenizer, usually)."""
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(token_id for token_id in ids if not 0 <= token_id < vocab_size)
        raise ValueError(
            f"token id {bad} is outside the vocabulary (valid ids are 0..{vocab_size - 1}); "
            "were these ids made by another tokenizer?"
        )


def _chunks(items: Sequence[str], count: int) -> list[Sequence[str]]:
    size = -(-len(items) // count)
    return [items[start : start + size] for start in range(0, len(items), size)]


def _batch(
    encode_one: Callable[[str], list[int]],
    texts: Sequence[str],
    num_threads: int | None,
    encode_chunk: Callable[[Sequence[str]], list[list[int]]] | None = None,
) -> list[list[int]]:
    """Encode `texts` in contiguous chunks on a thread pool (the engine releases the GIL while it works)."""
    texts = list(texts)
    workers = max(1, min(num_threads or os.cpu_count() or 1, len(texts)))
    if encode_chunk is None:

        def encode_chunk(chunk: Sequence[str]) -> list[list[int]]:
            return [encode_one(text) for text in chunk]

    if workers == 1:
        return encode_chunk(texts)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(encode_chunk, _chunks(texts, workers * CHUNKS_PER_WORKER))
        return [ids for chunk in results for ids in chunk]


# ------------------------------------------------------------------------------------------ the vocabulary


class _RankTable:
    """tiktoken's view of a vocabulary: {bytes: rank} in merge order, and the rank <-> id translation.

    `id_of_rank` is None when ranks equal ids (GPT-2's own files, our trained ones): no translation cost.
    """

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], specials: dict[str, int]) -> None:
        results = list(dict.fromkeys(left + right for left, right in merges))  # first occurrence = its rank
        result_ids = [vocab[result] for result in results]
        if all(a < b for a, b in zip(result_ids, result_ids[1:], strict=False)):
            self.id_of_rank: list[int] | None = None
            self.mergeable = {symbol_to_bytes(symbol): vocab[symbol] for symbol in bytes_to_unicode().values()}
            self.mergeable.update({symbol_to_bytes(result): vocab[result] for result in results})
            self.special = dict(specials)
            return
        # renumber: bytes 0..255, merge results 256.. in merge order, then special tokens
        ordered = list(bytes_to_unicode().values()) + results
        self.mergeable = {symbol_to_bytes(symbol): rank for rank, symbol in enumerate(ordered)}
        self.special = {text: len(ordered) + index for index, text in enumerate(specials)}
        self.id_of_rank = [vocab[symbol] for symbol in ordered] + list(specials.values())


def _check_vocabulary(
    vocab: dict[str, int], merges: list[tuple[str, str]], declared_specials: set[str], where: str
) -> dict[str, int]:
    """Check that vocabulary and merges belong together; return the special tokens {text: id}.

    Raises ValueError naming the first inconsistency: a missing byte, a merge whose parts or result are not
    in the vocabulary, duplicate or missing ids, or entries that no merge makes (a truncated merges file or
    one from another vocabulary: the sizes disagree).
    """
    missing_bytes = [(byte, symbol) for byte, symbol in bytes_to_unicode().items() if symbol not in vocab]
    if missing_bytes:
        byte, symbol = missing_bytes[0]
        raise ValueError(
            f"{where}: the vocabulary lacks the symbol {symbol!r} for byte {byte} "
            f"({len(missing_bytes)} bytes missing); byte-level BPE needs all 256 bytes"
        )
    by_id: dict[int, str] = {}
    for symbol, token_id in vocab.items():
        if token_id in by_id:
            raise ValueError(f"{where}: id {token_id} is given to both {by_id[token_id]!r} and {symbol!r}")
        by_id[token_id] = symbol
    gaps = sorted(set(range(len(vocab))) - set(by_id))
    if gaps:
        raise ValueError(
            f"{where}: ids must be 0..{len(vocab) - 1} without gaps, but id {gaps[0]} is missing "
            f"(largest id is {max(by_id)})"
        )
    results = set()
    for number, (left, right) in enumerate(merges, start=1):
        for part in (left, right):
            if part not in vocab:
                raise ValueError(
                    f"{where}: merge {number} ({left!r} {right!r}) uses {part!r}, which is not in "
                    "the vocabulary; the merges do not belong to this vocabulary"
                )
        if left + right not in vocab:
            raise ValueError(
                f"{where}: merge {number} ({left!r} {right!r}) makes {left + right!r}, which is not "
                "in the vocabulary; the merges do not belong to this vocabulary"
            )
        results.add(left + right)
    alphabet = set(bytes_to_unicode().values())
    leftovers = [symbol for symbol in vocab if symbol not in alphabet and symbol not in results]
    strays = [
        symbol for symbol in leftovers if symbol not in declared_specials and not SPECIAL_TOKEN_SHAPE.fullmatch(symbol)
    ]
    if strays:
        raise ValueError(
            f"{where}: the vocabulary has {len(vocab)} entries but 256 bytes + {len(results)} merge results + "
            f"{len(leftovers) - len(strays)} special tokens account for only {len(vocab) - len(strays)}; "
            f"{len(strays)} entries such as {strays[:3]} are made by no merge, so the merges file is truncated "
            "or belongs to another vocabulary"
        )
    return {symbol: vocab[symbol] for symbol in sorted(leftovers, key=vocab.__getitem__)}


class Tokenizer:
    """GPT-2 byte-level BPE tokenizer over a vocabulary {symbol: id} and ordered merges.

    Build it with `gpt2.tokenizer.load_tokenizer(dir_or_hub_name)`, `Tokenizer.from_files(vocab, merges)` or
    `gpt2.tokenizer.train_tokenizer(...)`.
    """

    kind = "byte-level-bpe"

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        *,
        special_tokens: Iterable[str] = (),
        source: str = "<memory>",
    ) -> None:
        """`special_tokens` declares extra entries that no merge makes (texts shaped `<|...|>` need not be
        declared). Raises ValueError when vocabulary and merges disagree (see `_check_vocabulary`)."""
        self._vocab = dict(vocab)
        self._merges = [(left, right) for left, right in merges]
        self.special_tokens = _check_vocabulary(self._vocab, self._merges, set(special_tokens), source)
        self.source = source
        self._table = _RankTable(self._vocab, self._merges, self.special_tokens)
        self._encoding = tiktoken.Encoding(
            name=f"gpt2-bpe-{len(self._vocab)}",
            pat_str=TIKTOKEN_SPLIT_PATTERN,
            mergeable_ranks=self._table.mergeable,
            special_tokens=self._table.special,
        )
        # id -> bytes for decoding; a special token decodes to its text
        self._bytes_of_id: list[bytes] = [b""] * len(self._vocab)
        for symbol, token_id in self._vocab.items():
            is_special = symbol in self.special_tokens
            self._bytes_of_id[token_id] = symbol.encode("utf-8") if is_special else symbol_to_bytes(symbol)
        canonical = json.dumps([sorted(self._vocab, key=self._vocab.__getitem__), self._merges], ensure_ascii=False)
        self.identity = f"{self.kind}:sha256:{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"

    @classmethod
    def from_files(cls, vocab_file: str | Path, merges_file: str | Path) -> Tokenizer:
        """Load encoder.json/vocab.json (`{symbol: id}`) and vocab.bpe/merges.txt (one merge per line)."""
        vocab_file, merges_file = Path(vocab_file), Path(merges_file)
        vocab = read_vocab(vocab_file)
        merges = read_merges(merges_file)
        return cls(vocab, merges, source=f"{vocab_file} + {merges_file.name}")

    def save(self, directory: str | Path) -> Path:
        """Write encoder.json + vocab.bpe (OpenAI) and vocab.json + merges.txt (Hugging Face); same content."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_vocab_and_merges(directory, self._vocab, self._merges)
        return directory

    # -------------------------------------------------------------------------------------------- encoding

    def encode(self, text: str, *, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Text -> ids. Special-token texts are ordinary text unless listed in `allowed_special` (or 'all')."""
        allowed = resolve_allowed(allowed_special, self.special_tokens) if allowed_special else frozenset()
        if allowed:
            ranks = self._encoding.encode(text, allowed_special=set(allowed), disallowed_special=())
        else:
            ranks = self._encoding.encode_ordinary(text)
        if self._table.id_of_rank is None:
            return ranks
        id_of_rank = self._table.id_of_rank
        return [id_of_rank[rank] for rank in ranks]

    def encode_batch(
        self, texts: Sequence[str], *, allowed_special: AllowedSpecial = frozenset(), num_threads: int | None = None
    ) -> list[list[int]]:
        """Encode many texts on `num_threads` threads (default: all cores); same ids as `encode` on each."""
        if allowed_special:
            resolve_allowed(allowed_special, self.special_tokens)  # fail before starting threads

        def encode_one(text: str) -> list[int]:
            return self.encode(text, allowed_special=allowed_special)

        if allowed_special or not self.special_tokens:
            return _batch(encode_one, texts, num_threads)
        return _batch(encode_one, texts, num_threads, encode_chunk=self._encode_ordinary_chunk)

    def _encode_ordinary_chunk(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts with ONE engine call: joined by a special token, which the engine splits on before
        pre-tokenizing, so every text gets exactly its own `encode` ids. One call per text would release and
        retake the GIL per text, which makes two threads slower than one on many short strings."""
        separator, separator_id = next(iter(self.special_tokens.items()))
        # a separator with a border (a prefix equal to a suffix, e.g. '<a><a>') could match across a join
        has_border = any(separator[:k] == separator[-k:] for k in range(1, len(separator)))
        if len(texts) < 2 or has_border or any(separator in text for text in texts):
            return [self.encode(text) for text in texts]  # a literal separator in the text must stay text
        ids = self.encode(separator.join(texts), allowed_special={separator})
        pieces, start = [], 0
        for _ in range(len(texts) - 1):
            end = ids.index(separator_id, start)
            pieces.append(ids[start:end])
            start = end + 1
        pieces.append(ids[start:])
        return pieces

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Ids -> raw bytes (a token may end in the middle of a character)."""
        check_ids(ids, len(self._bytes_of_id))
        return b"".join([self._bytes_of_id[token_id] for token_id in ids])

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; bytes that are not valid UTF-8 become U+FFFD instead of raising."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        """A decoder fed one id at a time that never splits a character (see `StreamDecoder`)."""
        return StreamDecoder(lambda token_id: self.decode_bytes([token_id]))

    # ------------------------------------------------------------------------------------------ properties

    @property
    def eot_token(self) -> int:
        """Id of `<|endoftext|>` (50256 for GPT-2)."""
        if EOT_TEXT not in self.special_tokens:
            raise ValueError(f"tokenizer from {self.source} has no {EOT_TEXT!r} token")
        return self.special_tokens[EOT_TEXT]

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def vocab(self) -> dict[str, int]:
        """A copy of {symbol: id}, symbols spelled in GPT-2's printable byte alphabet."""
        return dict(self._vocab)

    @property
    def merges(self) -> list[tuple[str, str]]:
        return list(self._merges)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, source={self.source!r}, identity={self.identity[:36]}...)"
