"""Token data on disk: `prepare` turns text into token shards, `load_split` and `BatchLoader` feed training.

On-disk format (one folder per prepared corpus, `MANIFEST_VERSION` 1):

- `train_000000.bin`, `train_000001.bin`, ..., `val_000000.bin`, ...: raw little-endian token ids, no
  header; `uint16` while every id fits (vocab_size <= 65536, GPT-2's 50257 does), else `uint32`.
- `manifest.json`, written last (its presence means the folder is complete): format name and version,
  tokenizer identity / vocab_size / eot id, dtype, token count per split, and per shard its file name,
  split, token count and sha256, plus the sources and what was skipped or repaired on the way.

The token stream: every document is *preceded* by the end-of-text token (as GPT-2's own data and llm.c's
fineweb/tinyshakespeare scripts do), so the stream starts with EOT and a model always sees EOT right before a
document begins. A document is one text file or one JSONL record (or one record of a Hugging Face dataset).
The stream is written in source order, then its last `val_fraction` of tokens becomes the val split (nanoGPT's
`data[int(n * 0.9):]`), so a single text file gets a val split too.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from gpt2.tokenizer.protocol import TextTokenizer

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "gpt2-token-shards"
MANIFEST_VERSION = 1
DOCUMENT_SEPARATOR = "eot_before_each_document"

# Suffixes a directory source contributes (anything else needs an explicit file or glob); .jsonl is parsed.
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".jsonl")
DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's shard size: 200 MB of uint16 per file
DEFAULT_CHUNK_CHARS = 1 << 18  # text is tokenized in pieces of at most this many characters
MAX_LISTED_FILES = 100  # the manifest names at most this many empty / repaired files (all are counted)
_COPY_TOKENS = 1 << 22  # tokens per read when splitting or hashing shards: bounded memory


def token_dtype(vocab_size: int) -> np.dtype:
    """The on-disk dtype for ids below `vocab_size`: little-endian uint16 when they fit, else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


# --------------------------------------------------------------------------------------------- reading


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """The validated manifest of a prepared folder; FileNotFoundError / ValueError say what is wrong."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"data directory {str(data_dir)!r} does not exist; create it with `gpt2 prepare SOURCES --out {data_dir}`"
        )
    path = data_dir / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} is missing, so {str(data_dir)!r} is not a prepared data directory (or preparing it "
            f"did not finish); run `gpt2 prepare SOURCES --out {data_dir}`"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not valid JSON ({err}); prepare the data again") from err
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{str(path)!r} is not a {MANIFEST_FORMAT} manifest; prepare the data again")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(
            f"{str(path)!r} has format version {manifest.get('version')!r}; this gpt2 reads version "
            f"{MANIFEST_VERSION}: prepare the data again with this version"
        )
    if manifest.get("dtype") not in ("uint16", "uint32") or manifest.get("byteorder") != "little":
        raise ValueError(
            f"{str(path)!r} has dtype {manifest.get('dtype')!r} / byteorder {manifest.get('byteorder')!r}; "
            "expected uint16 or uint32, little-endian"
        )
    for split, count in manifest["splits"].items():
        shard_total = sum(s["tokens"] for s in manifest["shards"] if s["split"] == split)
        if shard_total != count:
            raise ValueError(
                f"{str(path)!r} is inconsistent: split {split!r} has {count} tokens but its shards hold "
                f"{shard_total}; prepare the data again"
            )
    return manifest


def load_split(data_dir: str | Path, split: str, *, verify: bool = False) -> np.ndarray:
    """The 1-D token array of `split` ("train" or "val") of a folder written by `prepare`.

    A split held in one shard is returned memory-mapped (read-only, nothing loaded); a split of several shards
    is concatenated into memory. `verify=True` also checks every shard's sha256 against the manifest.

    >>> tokens = load_split("data/shakespeare", "train")  # doctest: +SKIP
    >>> tokens.dtype, tokens.ndim                           # doctest: +SKIP
    (dtype('uint16'), 1)
    """
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    if split not in manifest["splits"]:
        raise ValueError(
            f"{str(data_dir)!r} has no split {split!r}; it has: {', '.join(manifest['splits']) or 'none'}"
        )
    dtype = np.dtype("<u2") if manifest["dtype"] == "uint16" else np.dtype("<u4")
    arrays = []
    for shard in manifest["shards"]:
        if shard["split"] != split:
            continue
        path = data_dir / shard["file"]
        if not path.is_file():
            raise FileNotFoundError(
                f"shard {str(path)!r} listed in the manifest is missing; prepare the data again"
            )
        expected = shard["tokens"] * dtype.itemsize
        actual = path.stat().st_size
        if actual != expected:
            raise ValueError(
                f"shard {str(path)!r} has {actual} bytes but the manifest says {shard['tokens']} "
                f"{manifest['dtype']} tokens = {expected} bytes; the file is truncated or from another run: "
                "prepare the data again"
            )
        if verify and _sha256(path) != shard["sha256"]:
            raise ValueError(f"shard {str(path)!r} does not match its sha256 in the manifest; prepare the data again")
        if shard["tokens"] > 0:
            arrays.append(np.memmap(path, dtype=dtype, mode="r", shape=(shard["tokens"],)))
    if not arrays:
        return np.zeros(0, dtype=dtype)
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------- batches


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed for (seed, step), well mixed so neighbouring steps are unrelated.

    Each step gets its own seed, so a loader's whole state is its step number and resuming is O(1).
    """
    words = np.random.SeedSequence([seed, step]).generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


class BatchLoader:
    """Batches of (x, y) next-token pairs, shape (batch_size, block_size), y = x shifted left by one.

    shuffle=True (nanoGPT): every step draws batch_size * world_size random start offsets from a
    torch.Generator seeded by (seed, step). shuffle=False (llm.c): the stream is cut into consecutive windows of
    block_size tokens (the last window needs one more token for its target) and read in order, wrapping around
    to the start after the last whole window.

    Distributed: every rank computes the same global batch of batch_size * world_size rows and keeps rows
    rank * batch_size ... (rank + 1) * batch_size - 1, so the union over ranks equals what one process with
    batch_size * world_size gets; a 2-process run sees the same data as a 1-process run with the same global
    batch. For the same reason a state_dict may be loaded under another world size with the same global batch.

    >>> loader = BatchLoader(np.arange(100, dtype=np.uint16), batch_size=2, block_size=8)
    >>> x, y = loader.next_batch()
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
    (torch.Size([2, 8]), True)
    """

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        block_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("block_size", block_size), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D array, got shape {tuple(tokens.shape)}")
        if len(tokens) < block_size + 1:
            raise ValueError(
                f"the split has {len(tokens)} tokens; need at least block_size+1 = {block_size + 1}; "
                "use a smaller block size or more data"
            )
        self.tokens = tokens
        self.batch_size = batch_size
        self.block_size = block_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.step = 0
        # sequential mode reads windows [k*T, k*T + T] (T+1 tokens with the target), k < num_windows
        self.num_windows = (len(tokens) - 1) // block_size

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def _offsets(self, step: int) -> np.ndarray:
        """Start offsets of this rank's rows at `step`, shape (batch_size,)."""
        B, T = self.batch_size, self.block_size
        if self.shuffle:
            generator = torch.Generator().manual_seed(_step_seed(self.seed, step))
            # the largest start is len - T - 1, so the target of the last position exists
            offsets = torch.randint(len(self.tokens) - T, (self.global_batch_size,), generator=generator).numpy()
        else:
            first_row = step * self.global_batch_size
            rows = np.arange(first_row, first_row + self.global_batch_size, dtype=np.int64)
            offsets = (rows % self.num_windows) * T
        return offsets[self.rank * B : (self.rank + 1) * B]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y), both int64 of shape (batch_size, block_size), on the CPU."""
        T = self.block_size
        rows = np.stack([self.tokens[o : o + T + 1] for o in self._offsets(self.step)]).astype(np.int64)  # (B, T+1)
        self.step += 1
        batch = torch.from_numpy(rows)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and bools (JSON-safe): the step to continue from and what must match on resume."""
        return {
            "step": self.step,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "global_batch_size": self.global_batch_size,
            "block_size": self.block_size,
            "num_tokens": len(self.tokens),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the loader that produced `state` stopped (same data, seed and global batch)."""
        expected = self.state_dict()
        for key in ("seed", "shuffle", "global_batch_size", "block_size", "num_tokens"):
            if state.get(key) != expected[key]:
                raise ValueError(
                    f"cannot resume the batch loader: the saved state has {key}={state.get(key)!r} but this loader "
                    f"has {key}={expected[key]!r}; resume with the same data, seed, shuffle, block size and "
                    "global batch size (batch_size * world_size)"
                )
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"the saved batch loader state has step={step!r}; expected a non-negative integer")
        self.step = step


# --------------------------------------------------------------------------------------------- sources


@dataclass
class _Source:
    """One source as the caller named it, and the files it expanded to (sorted)."""

    spec: str
    kind: str  # "file", "directory", "glob" or "dataset"
    files: list[Path] = field(default_factory=list)
    documents: int = 0
    tokens: int = 0


def expand_sources(sources: Sequence[str | Path]) -> list[_Source]:
    """Expand files, directories (recursively: files ending in TEXT_SUFFIXES, hidden ones skipped) and globs.

    Order is the caller's order of sources, and sorted paths within a directory or glob, so the token stream
    is the same on every machine. A source that matches nothing is a FileNotFoundError naming it.
    """
    expanded = []
    for spec in sources:
        text = str(spec)
        path = Path(text).expanduser()
        if path.is_file():
            expanded.append(_Source(text, "file", [path]))
        elif path.is_dir():
            files = sorted(
                (
                    p
                    for p in path.rglob("*")
                    if p.suffix.lower() in TEXT_SUFFIXES
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                    and p.is_file()
                ),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not files:
                raise FileNotFoundError(
                    f"directory {text!r} has no text files ({', '.join(TEXT_SUFFIXES)}); "
                    f"pass a glob such as '{text.rstrip('/')}/**/*.html' to choose other files"
                )
            expanded.append(_Source(text, "directory", files))
        elif re.search(r"[*?\[]", text):
            matches = sorted(glob.glob(os.path.expanduser(text), recursive=True))
            files = [Path(m) for m in matches if Path(m).is_file()]
            if not files:
                raise FileNotFoundError(f"source glob {text!r} matches no files; check the pattern and the directory")
            expanded.append(_Source(text, "glob", files))
        else:
            raise FileNotFoundError(f"source {text!r} does not exist; pass a text file, .jsonl file, directory or glob")
    return expanded


def iter_hf_dataset(
    name: str, *, split: str = "train", config: str | None = None, text_field: str = "text"
) -> Iterator[str]:
    """The documents (`text_field` of each record) of a Hugging Face dataset, streamed (needs `datasets`, online).

    The only place data preparation may reach the network; everything else reads local files.
    """
    try:
        import datasets  # optional dependency: pip install 'gpt2[datasets]'
    except ImportError as err:
        raise ValueError(
            f"reading the Hugging Face dataset {name!r} needs the `datasets` library, which is not installed; "
            "`pip install 'gpt2[datasets]'`, or download the data and pass local files"
        ) from err
    try:
        records = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as err:  # offline, unknown name, missing config: all end the same way for the caller
        first_line = str(err).splitlines()[0] if str(err) else "no details"
        raise ValueError(
            f"could not load Hugging Face dataset {name!r} (config {config!r}, split {split!r}): "
            f"{type(err).__name__}: {first_line}; check the name, config, split and the network"
        ) from err
    for index, record in enumerate(records):
        if text_field not in record:
            raise ValueError(
                f"record {index} of dataset {name!r} has no field {text_field!r} (fields: {', '.join(record)}); "
                "choose the text field with --jsonl-field NAME"
            )
        yield str(record[text_field])


# --------------------------------------------------------------------------------------------- text pieces

# A cut between a non-whitespace character and an ASCII whitespace character is always a pre-token boundary
# of GPT-2's split regex (no pattern runs from a non-space into a space, and the space starts the next match
# the same way whether or not text precedes it), so tokenizing the two pieces separately gives exactly the ids
# of the whole. The cut is only *before* ASCII whitespace, which every regex engine calls \s; Python's \S
# (not str.isspace) is narrower than Unicode's non-White_Space, so "non-whitespace" here is non-whitespace
# for the tokenizer's engine too. Searched on the reversed window: the first match there is the last cut here.
_SAFE_CUT_REVERSED = re.compile(r"[ \t\n\r\f\v](?=\S)")
_REPLACEMENT = "\ufffd"
_REPLACEMENT_UTF8 = _REPLACEMENT.encode("utf-8")


@dataclass
class _Report:
    """What `prepare` skipped or repaired, for the manifest."""

    documents: int = 0
    files: int = 0
    empty_files: list[str] = field(default_factory=list)
    empty_records: int = 0
    invalid_files: list[tuple[str, int]] = field(default_factory=list)
    forced_splits: int = 0


def _cut_point(text: str, limit: int, report: _Report) -> int:
    """Where to cut `text` (longer than `limit`) so the first piece has at most `limit` characters.

    The last safe cut (see _SAFE_CUT_REVERSED) in the window; without one (a single word longer than the
    window) a forced cut at `limit`, which may change the tokens at that one place only.
    """
    window = text[: limit + 1]  # a cut at index `limit` looks at text[limit]
    match = _SAFE_CUT_REVERSED.search(window[::-1])
    if match is not None:
        return len(window) - 1 - match.start()
    report.forced_splits += 1
    return limit


def _pieces(blocks: Iterable[str], chunk_chars: int, report: _Report) -> Iterator[str]:
    """Re-cut a stream of text blocks into pieces of at most `chunk_chars` characters at safe places."""
    buffer = ""
    for block in blocks:
        buffer += block
        while len(buffer) > chunk_chars:
            cut = _cut_point(buffer, chunk_chars, report)
            assert 0 < cut <= chunk_chars, cut  # an empty piece would loop forever
            yield buffer[:cut]
            buffer = buffer[cut:]
    if buffer:
        yield buffer


def _text_file_blocks(path: Path, block_bytes: int, report: _Report) -> Iterator[str]:
    """The decoded text of a file in blocks: UTF-8, invalid bytes replaced by U+FFFD and counted."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    replacements = genuine = 0
    tail = b""  # the last 2 bytes, to count a genuine U+FFFD (3 bytes) that straddles two reads
    with open(path, "rb") as f:
        while raw := f.read(block_bytes):
            genuine += (tail + raw).count(_REPLACEMENT_UTF8)
            tail = (tail + raw)[-2:]
            text = decoder.decode(raw)
            replacements += text.count(_REPLACEMENT)
            yield text
        text = decoder.decode(b"", final=True)  # a truncated sequence at the very end
        replacements += text.count(_REPLACEMENT)
        if text:
            yield text
    if replacements > genuine:
        report.invalid_files.append((str(path), replacements - genuine))


def _jsonl_documents(path: Path, text_field: str, report: _Report) -> Iterator[str]:
    """The `text_field` of each record of a JSONL file (one JSON object per line; blank lines skipped)."""
    invalid = 0
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            line = raw.decode("utf-8", errors="replace")
            invalid += line.count(_REPLACEMENT) - raw.count(_REPLACEMENT_UTF8)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}:{line_number}: not valid JSON ({err.msg} at column {err.colno}); "
                    "each line of a .jsonl file must be one JSON object"
                ) from err
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}; "
                    "each line of a .jsonl file must be one JSON object"
                )
            if text_field not in record:
                raise ValueError(
                    f"{path}:{line_number}: the record has no field {text_field!r} "
                    f"(fields: {', '.join(map(str, record)) or 'none'}); choose the text field with "
                    "jsonl_field=... (--jsonl-field NAME)"
                )
            text = record[text_field]
            if not isinstance(text, str):
                raise ValueError(
                    f"{path}:{line_number}: field {text_field!r} holds {type(text).__name__}, not a string; "
                    "choose the text field with jsonl_field=... (--jsonl-field NAME)"
                )
            if not text:
                report.empty_records += 1
                continue
            yield text
    if invalid > 0:
        report.invalid_files.append((str(path), invalid))


def _document_pieces(
    sources: list[_Source],
    dataset_documents: Iterable[str] | None,
    text_field: str,
    chunk_chars: int,
    report: _Report,
) -> Iterator[tuple[int, bool, str]]:
    """(source index, starts a document, text) for every piece of every document, in stream order."""
    for index, source in enumerate(sources):
        for path in source.files:
            report.files += 1
            if path.stat().st_size == 0:
                report.empty_files.append(str(path))
                continue
            if path.suffix.lower() == ".jsonl":
                documents: Iterable[Iterable[str]] = ([text] for text in _jsonl_documents(path, text_field, report))
            else:
                documents = [_text_file_blocks(path, chunk_chars, report)]
            for blocks in documents:
                source.documents += 1
                report.documents += 1
                for piece_number, piece in enumerate(_pieces(blocks, chunk_chars, report)):
                    yield index, piece_number == 0, piece
    if dataset_documents is not None:
        index = len(sources) - 1  # the dataset is the last source
        for text in dataset_documents:
            if not text:
                report.empty_records += 1
                continue
            sources[index].documents += 1
            report.documents += 1
            for piece_number, piece in enumerate(_pieces([text], chunk_chars, report)):
                yield index, piece_number == 0, piece


# --------------------------------------------------------------------------------------------- writing


class _StreamWriter:
    """Appends tokens to numbered stream files of at most `shard_tokens` tokens each."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory = directory
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.paths: list[Path] = []
        self.counts: list[int] = []
        self._file: Any = None

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens) > 0:
            if self._file is None or self.counts[-1] == self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.counts[-1]
            part = tokens[:room]
            self._file.write(part.astype(self.dtype, copy=False).tobytes())
            self.counts[-1] += len(part)
            tokens = tokens[room:]

    def _open_next(self) -> None:
        self.close()
        path = self.directory / f"stream_{len(self.paths):06d}.bin"
        self._file = open(path, "wb")
        self.paths.append(path)
        self.counts.append(0)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _copy_tokens(source: Path, dtype: np.dtype, start: int, stop: int, target: Path) -> None:
    """Write tokens [start, stop) of the raw file `source` to `target`, a bounded block at a time."""
    tokens = np.memmap(source, dtype=dtype, mode="r")
    with open(target, "wb") as f:
        for begin in range(start, stop, _COPY_TOKENS):
            f.write(np.asarray(tokens[begin : min(begin + _COPY_TOKENS, stop)]).tobytes())
    del tokens


def _split_stream(writer: _StreamWriter, train_tokens: int, staging: Path) -> list[tuple[str, Path, int]]:
    """Turn the stream files into train shards (the first `train_tokens` tokens) and val shards (the rest).

    Whole stream files are renamed; only the one file holding the boundary is copied, in two parts.
    Returns (split, path, token count) per shard, in order.
    """
    shards: list[tuple[str, Path, int]] = []

    def next_path(split: str) -> Path:
        return staging / f"{split}_{sum(1 for s, _, _ in shards if s == split):06d}.bin"

    start = 0
    for path, count in zip(writer.paths, writer.counts):
        stop = start + count
        if stop <= train_tokens or start >= train_tokens:
            split = "train" if stop <= train_tokens else "val"
            target = next_path(split)
            os.replace(path, target)
            shards.append((split, target, count))
        else:
            boundary = train_tokens - start
            train_path = next_path("train")
            _copy_tokens(path, writer.dtype, 0, boundary, train_path)
            shards.append(("train", train_path, boundary))
            val_path = next_path("val")
            _copy_tokens(path, writer.dtype, boundary, count, val_path)
            shards.append(("val", val_path, count - boundary))
            path.unlink()
        start = stop
    return shards


def _check_tokenizer(tokenizer: Any) -> None:
    missing = [name for name in ("encode_batch", "eot_token", "vocab_size", "identity") if not hasattr(tokenizer, name)]
    if missing:
        raise ValueError(
            f"the tokenizer {type(tokenizer).__name__} lacks {', '.join(missing)}; pass a gpt2.tokenizer "
            "Tokenizer or ByteTokenizer"
        )
    if not 0 <= tokenizer.eot_token < tokenizer.vocab_size:
        raise ValueError(
            f"the tokenizer's eot_token {tokenizer.eot_token} is outside its vocabulary of {tokenizer.vocab_size}"
        )


def _listed(paths: list[str]) -> dict[str, Any]:
    return {"count": len(paths), "files": paths[:MAX_LISTED_FILES]}


def prepare(
    sources: Sequence[str | Path],
    out_dir: str | Path,
    tokenizer: TextTokenizer,
    *,
    jsonl_field: str = "text",
    val_fraction: float = 0.1,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    dataset: str | None = None,
    dataset_split: str = "train",
    dataset_config: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenize text files, directories, globs, JSONL files (and optionally a HF dataset) into token shards.

    Streams: memory stays bounded however large the input, because files are read and tokenized in pieces of
    at most `chunk_chars` characters, cut at a whitespace boundary that cannot change the tokens (a word longer
    than a piece is cut inside, which can change the tokens at that one place: counted as forced_splits).
    Pieces are tokenized in batches with `tokenizer.encode_batch`, on all cores. Each document is preceded by
    the end-of-text token; the last `val_fraction` of the stream is the val split. Invalid UTF-8 is replaced
    by U+FFFD (counted per file in the manifest and warned about); empty files and empty JSONL records are
    skipped and counted. `jsonl_field` names the text field of JSONL and dataset records. The output is
    byte-for-byte the same for the same inputs. Returns the manifest (also written to out_dir/manifest.json).

    >>> from gpt2.tokenizer import Tokenizer                                    # doctest: +SKIP
    >>> manifest = prepare(["input.txt"], "data/shakespeare", load_tokenizer("gpt2"))  # doctest: +SKIP
    >>> manifest["splits"]                                                       # doctest: +SKIP
    {'train': 304223, 'val': 33803}
    """
    _check_tokenizer(tokenizer)
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    for name, value in (("shard_tokens", shard_tokens), ("chunk_chars", chunk_chars)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not sources and dataset is None:
        raise ValueError("nothing to prepare: pass at least one source (file, directory, glob) or a dataset name")

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"output {str(out_dir)!r} is a file; pass a directory with --out")
    if (out_dir / MANIFEST_NAME).exists() and not overwrite:
        raise FileExistsError(
            f"{str(out_dir)!r} already holds prepared data; pass overwrite=True (--overwrite) to replace it, "
            "or choose another output directory"
        )
    expanded = expand_sources(sources)
    dataset_documents = None
    if dataset is not None:
        dataset_documents = iter_hf_dataset(dataset, split=dataset_split, config=dataset_config, text_field=jsonl_field)
        described = f"{dataset} ({'config ' + dataset_config + ', ' if dataset_config else ''}split {dataset_split})"
        expanded.append(_Source(described, "dataset"))

    dtype = token_dtype(tokenizer.vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / ".prepare-staging"
    if staging.exists():  # left behind by an interrupted run
        shutil.rmtree(staging)
    staging.mkdir()
    report = _Report()
    writer = _StreamWriter(staging, dtype, shard_tokens)
    try:
        pieces = _document_pieces(expanded, dataset_documents, jsonl_field, chunk_chars, report)
        _tokenize_into(writer, tokenizer, pieces, expanded, chunk_chars, progress)
        writer.close()
        total = sum(writer.counts)
        if total == 0:
            raise ValueError(
                f"the sources hold no text ({report.files} file(s), {len(report.empty_files)} empty, "
                f"{report.empty_records} empty record(s)); pass files with text in them"
            )
        train_tokens = int(total * (1.0 - val_fraction))  # nanoGPT: data[: int(n * 0.9)]
        shards = _split_stream(writer, train_tokens, staging)
        manifest = _manifest(
            tokenizer, dtype, val_fraction, shard_tokens, chunk_chars, jsonl_field,
            train_tokens, total - train_tokens, shards, expanded, report,
        )
        _replace_output(out_dir, staging, shards, manifest)
    finally:
        writer.close()
        shutil.rmtree(staging, ignore_errors=True)
    if report.invalid_files:
        first, count = report.invalid_files[0]
        warnings.warn(
            f"{len(report.invalid_files)} file(s) had bytes that are not valid UTF-8, replaced by U+FFFD "
            f"(first: {first}, {count} replacement(s)); see 'invalid_utf8' in {out_dir / MANIFEST_NAME}",
            stacklevel=2,
        )
    return manifest


def _tokenize_into(
    writer: _StreamWriter,
    tokenizer: TextTokenizer,
    pieces: Iterator[tuple[int, bool, str]],
    sources: list[_Source],
    chunk_chars: int,
    progress: bool,
) -> None:
    """Tokenize the pieces in batches big enough to keep every core busy, appending to the stream in order."""
    from tqdm.auto import tqdm

    # enough pieces per encode_batch call for the tokenizer's threads, few enough to keep memory bounded
    batch_chars = chunk_chars * max(8, 2 * (os.cpu_count() or 1))
    bar = tqdm(unit="tok", unit_scale=True, desc="tokenizing", disable=not progress)
    batch: list[tuple[int, bool, str]] = []
    size = 0

    def flush() -> None:
        ids_per_piece = tokenizer.encode_batch([text for _, _, text in batch])
        flat: list[int] = []
        for (index, starts_document, _), ids in zip(batch, ids_per_piece):
            if starts_document:
                flat.append(tokenizer.eot_token)
            flat.extend(ids)
            sources[index].tokens += len(ids) + starts_document
        tokens = np.asarray(flat, dtype=np.int64)
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= tokenizer.vocab_size):
            raise ValueError(
                f"the tokenizer produced id {int(tokens.max())} outside its vocab_size {tokenizer.vocab_size}"
            )
        writer.write(tokens)
        bar.update(len(tokens))

    try:
        for item in pieces:
            batch.append(item)
            size += len(item[2])
            if size >= batch_chars:
                flush()
                batch, size = [], 0
        if batch:
            flush()
    finally:
        bar.close()


def _manifest(
    tokenizer: TextTokenizer,
    dtype: np.dtype,
    val_fraction: float,
    shard_tokens: int,
    chunk_chars: int,
    jsonl_field: str,
    train_tokens: int,
    val_tokens: int,
    shards: list[tuple[str, Path, int]],
    sources: list[_Source],
    report: _Report,
) -> dict[str, Any]:
    """The manifest: everything needed to read the shards and to know how they were made. No timestamps or
    absolute paths, so the same inputs give the same bytes."""
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "tokenizer": {
            "identity": tokenizer.identity,
            "vocab_size": tokenizer.vocab_size,
            "eot_token": tokenizer.eot_token,
        },
        "dtype": "uint16" if dtype.itemsize == 2 else "uint32",
        "byteorder": "little",
        "document_separator": DOCUMENT_SEPARATOR,
        "val_fraction": val_fraction,
        "splits": {"train": train_tokens, "val": val_tokens},
        "shards": [
            {"file": path.name, "split": split, "tokens": count, "sha256": _sha256(path)}
            for split, path, count in shards
        ],
        "documents": report.documents,
        "sources": [
            {"source": s.spec, "kind": s.kind, "files": len(s.files), "documents": s.documents, "tokens": s.tokens}
            for s in sources
        ],
        "empty_files": _listed(report.empty_files),
        "empty_records": report.empty_records,
        "invalid_utf8": {
            "files": len(report.invalid_files),
            "replacements": sum(count for _, count in report.invalid_files),
            "examples": [
                {"file": path, "replacements": count} for path, count in report.invalid_files[:MAX_LISTED_FILES]
            ],
        },
        "forced_splits": report.forced_splits,
        "settings": {"shard_tokens": shard_tokens, "chunk_chars": chunk_chars, "jsonl_field": jsonl_field},
    }


def _replace_output(out_dir: Path, staging: Path, shards: list[tuple[str, Path, int]], manifest: dict) -> None:
    """Swap the new shards in: the old manifest goes first (the folder is then 'unfinished'), the new one last."""
    old_manifest = out_dir / MANIFEST_NAME
    if old_manifest.exists():
        try:
            old_files = [s["file"] for s in json.loads(old_manifest.read_text(encoding="utf-8")).get("shards", [])]
        except (json.JSONDecodeError, AttributeError, TypeError, KeyError):
            old_files = []
        old_manifest.unlink()
        for name in old_files:
            if Path(name).name == name:  # never follow a path out of out_dir
                (out_dir / name).unlink(missing_ok=True)
    for _, path, _ in shards:
        os.replace(path, out_dir / path.name)
    temporary = staging / MANIFEST_NAME
    temporary.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, old_manifest)
