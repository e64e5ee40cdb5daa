"""GPT-2 tokenizers: byte-level BPE (`Tokenizer`), raw bytes (`ByteTokenizer`), and BPE training.

`Tokenizer` reads the vocabulary in any of the three common layouts (OpenAI's encoder.json + vocab.bpe,
Hugging Face's vocab.json + merges.txt, or a tokenizer.json), checks that vocabulary and merges belong
together, and encodes with tiktoken's Rust engine.

Why tiktoken (measured, see docs/benchmarks.md "## Tokenizer"): on tinyshakespeare x10 on a 2-core VM
tiktoken encodes ~12x faster single-threaded than the Hugging Face `tokenizers` engine behind
`GPT2TokenizerFast` (21 vs 1.7 MB/s), releases the GIL so a thread pool scales, and builds from local files with
no network.
Both give identical ids (tests/test_tokenizer.py pins that, and pins both against `bpe_reference`, the
plain-Python specification of the algorithm). Training uses HF `tokenizers`' BpeTrainer, which tiktoken lacks.

tiktoken merges by the rank of the merged token and uses rank == token id. That reproduces merges-file BPE only
when ids follow merge order (true of GPT-2's files and of everything `train_tokenizer` saves). For other
vocabularies the engine runs on ranks in merge order and the ids are translated back (`_RankTable`).
(tiktoken ranks the merged *string*, true BPE ranks the *pair*: they could differ where a token's string can also
be formed from a pair that is not its listed merge. The tests compare both with `bpe_reference` on GPT-2's
vocabulary and on trained ones, and have found no disagreement.)

Special tokens: the text `<|endoftext|>` inside ordinary input is ordinary text (tokenized as characters);
it becomes id 50256 only where the caller passes `allowed_special`.

>>> tok = Tokenizer.from_pretrained("path/to/gpt2-files")      # doctest: +SKIP
>>> tok.encode("Hello world")                                   # doctest: +SKIP
[15496, 995]
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import AbstractSet, Callable, Iterable, Iterator, Literal, Sequence

import tiktoken

from gpt2.runtime.files import atomic_write_text
from gpt2.tokenizer.reference import bytes_to_unicode, gpt2_byte_order, symbol_to_bytes, unicode_to_bytes

EOT_TEXT = "<|endoftext|>"
# GPT-2's split pattern (bpe_reference.GPT2_SPLIT_PATTERN) in tiktoken's equivalent, faster spelling
# (possessive quantifiers); the tests check the two split identically.
TIKTOKEN_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# What a vocabulary entry that no merge produces may look like to count as a special token.
SPECIAL_TOKEN_SHAPE = re.compile(r"<\|[^|]+\|>")
MERGES_HEADER = "#version: 0.2"
OPENAI_FILES = ("encoder.json", "vocab.bpe")
HF_FILES = ("vocab.json", "merges.txt")
TOKENIZER_JSON = "tokenizer.json"
BYTE_TOKENIZER_FILE = "byte_tokenizer.json"
HUB_PATTERNS = (*OPENAI_FILES, *HF_FILES, TOKENIZER_JSON, BYTE_TOKENIZER_FILE)
# encode_batch cuts the list into this many chunks per worker: one task per string (tiktoken's own batch
# API) drowns short strings in scheduling overhead; a few chunks per worker still balance uneven lengths.
CHUNKS_PER_WORKER = 4

AllowedSpecial = AbstractSet[str] | Literal["all"]


class StreamDecoder:
    """Turns token ids into text one id at a time, holding back bytes of a character not yet complete.

    A character such as '🤗' (4 UTF-8 bytes) may be split over two or three tokens; `push` returns '' until
    the token that completes it arrives. Concatenating every `push` and the final `flush` gives exactly
    `decode(all ids)`, invalid bytes included (each replaced by U+FFFD).

    >>> dec = tok.stream_decoder()                                # doctest: +SKIP
    >>> "".join(dec.push(i) for i in ids) + dec.flush()          # doctest: +SKIP
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


def _resolve_allowed(allowed_special: AllowedSpecial, special_tokens: dict[str, int]) -> frozenset[str]:
    if allowed_special == "all":
        return frozenset(special_tokens)
    if isinstance(allowed_special, str):
        raise ValueError(f"allowed_special={allowed_special!r}: pass a set of token texts such as "
                         f"{{{EOT_TEXT!r}}}, or the string 'all'")
    unknown = sorted(set(allowed_special) - set(special_tokens))
    if unknown:
        raise ValueError(f"allowed_special names {unknown}, which this tokenizer does not have; "
                         f"its special tokens are {sorted(special_tokens)}")
    return frozenset(allowed_special)


def _check_ids(ids: Sequence[int], vocab_size: int) -> None:
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(token_id for token_id in ids if not 0 <= token_id < vocab_size)
        raise ValueError(f"token id {bad} is outside the vocabulary (valid ids are 0..{vocab_size - 1}); "
                         "were these ids made by another tokenizer?")


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


# ----------------------------------------------------------------------------------------------- file reading


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary file {str(path)!r} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); the file is corrupt") from err


def _read_json(path: Path) -> object:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); "
                         "the file is corrupt or truncated, fetch it again") from err


def _read_vocab(path: Path) -> dict[str, int]:
    data = _read_json(path)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON object {{symbol: id}}, got {type(data).__name__}")
    for symbol, token_id in data.items():
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise ValueError(f"{path}: the id of {symbol!r} is {token_id!r}; ids must be integers")
    return data


def _parse_merges(lines: Iterable[str], where: str) -> list[tuple[str, str]]:
    merges = []
    for number, line in enumerate(lines, start=1):
        if (number == 1 and line.startswith("#version")) or not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{where} line {number}: expected two symbols separated by one space, got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def _read_merges(path: Path) -> list[tuple[str, str]]:
    return _parse_merges(_read_text(path).split("\n"), str(path))


def _read_tokenizer_json(path: Path) -> tuple[dict[str, int], list[tuple[str, str]], set[str]]:
    data = _read_json(path)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise ValueError(f"{path}: model type is {kind!r}; only byte-level BPE (GPT-2 style) is supported")
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    byte_level = [step for step in steps if step.get("type") == "ByteLevel"]
    if not byte_level:
        raise ValueError(f"{path}: the pre-tokenizer is {pre.get('type')!r}, not ByteLevel; only GPT-2 style "
                         "byte-level BPE is supported")
    if byte_level[0].get("add_prefix_space"):
        raise ValueError(f"{path}: ByteLevel add_prefix_space=true is not GPT-2's behaviour; set it to false")
    vocab = dict(model.get("vocab") or {})
    raw_merges = model.get("merges") or []
    # tokenizers < 0.20 writes merges as "a b" strings, newer versions as ["a", "b"] pairs
    lines = [merge if isinstance(merge, str) else " ".join(merge) for merge in raw_merges]
    merges = _parse_merges(lines, f"{path} model.merges entry")
    specials = set()
    for added in data.get("added_tokens") or []:
        vocab.setdefault(added["content"], added["id"])
        specials.add(added["content"])
    return vocab, merges, specials


# ------------------------------------------------------------------------------------------ the vocabulary


class _RankTable:
    """tiktoken's view of a vocabulary: {bytes: rank} in merge order, and the rank <-> id translation.

    `id_of_rank` is None when ranks equal ids (GPT-2's own files, our trained ones): no translation cost.
    """

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], specials: dict[str, int]) -> None:
        results = list(dict.fromkeys(left + right for left, right in merges))  # first occurrence = its rank
        result_ids = [vocab[result] for result in results]
        if all(a < b for a, b in zip(result_ids, result_ids[1:])):
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
        raise ValueError(f"{where}: the vocabulary lacks the symbol {symbol!r} for byte {byte} "
                         f"({len(missing_bytes)} bytes missing); byte-level BPE needs all 256 bytes")
    by_id: dict[int, str] = {}
    for symbol, token_id in vocab.items():
        if token_id in by_id:
            raise ValueError(f"{where}: id {token_id} is given to both {by_id[token_id]!r} and {symbol!r}")
        by_id[token_id] = symbol
    gaps = sorted(set(range(len(vocab))) - set(by_id))
    if gaps:
        raise ValueError(f"{where}: ids must be 0..{len(vocab) - 1} without gaps, but id {gaps[0]} is missing "
                         f"(largest id is {max(by_id)})")
    results = set()
    for number, (left, right) in enumerate(merges, start=1):
        for part in (left, right):
            if part not in vocab:
                raise ValueError(f"{where}: merge {number} ({left!r} {right!r}) uses {part!r}, which is not in "
                                 "the vocabulary; the merges do not belong to this vocabulary")
        if left + right not in vocab:
            raise ValueError(f"{where}: merge {number} ({left!r} {right!r}) makes {left + right!r}, which is not "
                             "in the vocabulary; the merges do not belong to this vocabulary")
        results.add(left + right)
    alphabet = set(bytes_to_unicode().values())
    leftovers = [symbol for symbol in vocab if symbol not in alphabet and symbol not in results]
    strays = [symbol for symbol in leftovers if symbol not in declared_specials and not SPECIAL_TOKEN_SHAPE.fullmatch(symbol)]
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

    Build it with `from_pretrained(dir_or_hub_name)`, `from_files(vocab, merges)` or `train_tokenizer(...)`.
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
        self._merges = [tuple(pair) for pair in merges]
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

    # ---------------------------------------------------------------------------------------- constructors

    @classmethod
    def from_files(cls, vocab_file: str | Path, merges_file: str | Path) -> Tokenizer:
        """Load encoder.json/vocab.json (`{symbol: id}`) and vocab.bpe/merges.txt (one merge per line)."""
        vocab_file, merges_file = Path(vocab_file), Path(merges_file)
        vocab = _read_vocab(vocab_file)
        merges = _read_merges(merges_file)
        return cls(vocab, merges, source=f"{vocab_file} + {merges_file.name}")

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path) -> Tokenizer | ByteTokenizer:
        """Load from a directory (or a Hub name such as 'gpt2', fetched when online).

        The directory may hold, in order of preference: a saved `ByteTokenizer` (byte_tokenizer.json),
        OpenAI's encoder.json + vocab.bpe, Hugging Face's vocab.json + merges.txt, or a tokenizer.json.
        """
        from gpt2.weights.hub import resolve_pretrained

        directory = resolve_pretrained(name_or_path, allow_patterns=HUB_PATTERNS)
        if (directory / BYTE_TOKENIZER_FILE).is_file():
            return ByteTokenizer.from_pretrained(directory)
        for vocab_name, merges_name in (OPENAI_FILES, HF_FILES):
            if (directory / vocab_name).is_file() or (directory / merges_name).is_file():
                return cls.from_files(directory / vocab_name, directory / merges_name)
        if (directory / TOKENIZER_JSON).is_file():
            vocab, merges, specials = _read_tokenizer_json(directory / TOKENIZER_JSON)
            return cls(vocab, merges, special_tokens=specials, source=str(directory / TOKENIZER_JSON))
        raise FileNotFoundError(
            f"{str(directory)!r} holds no tokenizer: expected encoder.json + vocab.bpe, vocab.json + merges.txt, "
            f"tokenizer.json, or {BYTE_TOKENIZER_FILE}"
        )

    def save(self, directory: str | Path) -> Path:
        """Write encoder.json + vocab.bpe (OpenAI) and vocab.json + merges.txt (Hugging Face); same content."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab_text = json.dumps(dict(sorted(self._vocab.items(), key=lambda item: item[1])), ensure_ascii=False)
        merges_text = "\n".join([MERGES_HEADER, *(f"{left} {right}" for left, right in self._merges)]) + "\n"
        for vocab_name, merges_name in (OPENAI_FILES, HF_FILES):
            atomic_write_text(directory / vocab_name, vocab_text)
            atomic_write_text(directory / merges_name, merges_text)
        return directory

    # -------------------------------------------------------------------------------------------- encoding

    def encode(self, text: str, *, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Text -> ids. Special-token texts are ordinary text unless listed in `allowed_special` (or 'all')."""
        allowed = _resolve_allowed(allowed_special, self.special_tokens) if allowed_special else frozenset()
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
            _resolve_allowed(allowed_special, self.special_tokens)  # fail before starting threads

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
        _check_ids(ids, len(self._bytes_of_id))
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


class ByteTokenizer:
    """The simplest tokenizer: ids 0..255 are the UTF-8 bytes, 256 is `<|endoftext|>` (vocab_size 257).

    Same interface as `Tokenizer`, for tiny models where a 50k-row embedding would dwarf the network.
    """

    kind = "bytes"
    vocab_size = 257
    eot_token = 256

    def __init__(self) -> None:
        self.special_tokens = {EOT_TEXT: self.eot_token}
        self.identity = f"{self.kind}:sha256:{hashlib.sha256(b'utf-8 bytes 0-255; <|endoftext|>=256').hexdigest()}"

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path) -> ByteTokenizer:
        """Load what `save` wrote (checks the file describes this tokenizer)."""
        path = Path(name_or_path) / BYTE_TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{str(path)!r} does not exist; save a ByteTokenizer there first")
        data = _read_json(path)
        expected = cls._description()
        if data != expected:
            raise ValueError(f"{path}: describes {data!r}, expected {expected!r}; the file is corrupt or newer")
        return cls()

    @classmethod
    def _description(cls) -> dict[str, object]:
        return {"kind": cls.kind, "vocab_size": cls.vocab_size, "eot_token": cls.eot_token, "format_version": 1}

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / BYTE_TOKENIZER_FILE, json.dumps(self._description(), indent=2) + "\n")
        return directory

    def encode(self, text: str, *, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Text -> its UTF-8 bytes; `<|endoftext|>` becomes 256 only if allowed."""
        if allowed_special and _resolve_allowed(allowed_special, self.special_tokens):
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
        _check_ids(ids, self.vocab_size)
        if self.eot_token not in ids:
            return bytes(ids)
        return b"".join(EOT_TEXT.encode() if token_id == self.eot_token else bytes([token_id]) for token_id in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(lambda token_id: self.decode_bytes([token_id]))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=257)"


# ------------------------------------------------------------------------------------------------ training

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

    >>> tok = train_tokenizer([Path("corpus.txt")], vocab_size=8192)   # doctest: +SKIP
    >>> tok.save("my-tokenizer")                                         # doctest: +SKIP
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"vocab_size={vocab_size} is too small: 256 byte ids + <|endoftext|> need at least 257")
    if isinstance(texts, (str, os.PathLike)):
        texts = [texts]  # one text or one path, not an iterable of characters
    items = list(texts)
    paths = [Path(item) for item in items if isinstance(item, os.PathLike)]
    if paths and len(paths) != len(items):
        raise ValueError("train_tokenizer: pass either strings of text or paths, not a mix")
    if paths:
        files = list(_iter_training_files(paths, file_pattern))
        items = (file.read_text(encoding="utf-8", errors="replace") for file in files)

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
    model.train_from_iterator(_training_chunks(items), trainer=trainer)
    trained = json.loads(model.to_str())["model"]
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in trained["merges"]]

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


BYTE_TOKENIZER_NAMES = ("bytes", "byte")  # what `load_tokenizer` reads as "the plain byte tokenizer"


def load_tokenizer(spec: str | os.PathLike[str]) -> Tokenizer | ByteTokenizer:
    """'bytes' (or 'byte') -> ByteTokenizer(); anything else -> Tokenizer.from_pretrained (a directory holding
    any supported layout, a saved byte tokenizer included, or a Hub name)."""
    if str(spec) in BYTE_TOKENIZER_NAMES:
        return ByteTokenizer()
    return Tokenizer.from_pretrained(spec)
