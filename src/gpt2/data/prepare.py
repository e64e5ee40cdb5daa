"""`prepare`: text files, directories, globs, JSONL (and optionally a Hugging Face dataset) -> token shards.

The pipeline: expand the sources (`gpt2.data.sources`), read every document and cut it into pieces, tokenize
batches of pieces on all cores (a batch is tokenized while the next one is read), append the ids (each document
preceded by the end-of-text token) to numbered stream files in a staging folder, split the stream into train and
val shards, then swap the shards and the manifest (`gpt2.data.shards`, which describes the format) into the
output folder, manifest last.

Crash-safe and resumable: each full stream file is flushed to disk and recorded in the staging folder's progress
file (`gpt2.data.progress`) before the run goes on. Running the same command again after a crash or Ctrl-C keeps
the finished files (checked by sha256), reads on from where they end, and writes the same bytes as an
uninterrupted run. Memory stays bounded: a few batches of text and ids are held at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpt2.data.progress import (
    PROGRESS_NAME,
    Progress,
    ResumePoint,
    read_progress,
    report_from_dict,
    write_progress,
)
from gpt2.data.shards import DOCUMENT_SEPARATOR, MANIFEST_NAME, manifest_header, token_dtype
from gpt2.data.sources import Piece, Report, Source, document_pieces, expand_sources
from gpt2.runtime.notices import notice
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights.hub import iter_hf_dataset

DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's shard size: 200 MB of uint16 per file
DEFAULT_CHUNK_CHARS = 1 << 18  # text is tokenized in pieces of at most this many characters
MAX_LISTED_FILES = 100  # the manifest names at most this many empty / repaired files (all are counted)
STAGING_DIR = ".prepare-staging"  # inside the output folder: stream files and the progress file of a run
BATCHES_IN_FLIGHT = 2  # batches being tokenized while the next one is read: overlaps reading with encoding
_COPY_TOKENS = 1 << 22  # tokens per read when splitting shards: bounded memory


class _StreamWriter:
    """Appends tokens to numbered stream files of at most `shard_tokens` tokens each, hashing as it writes.

    A file that reaches `shard_tokens` is flushed to disk, closed and listed in `finished` at once.
    """

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int, finished: list[dict[str, Any]]) -> None:
        self.directory = directory
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.finished = list(finished)  # {"file", "tokens", "sha256"}
        self.paths: list[Path] = [directory / entry["file"] for entry in finished]
        self.counts: list[int] = [entry["tokens"] for entry in finished]
        self.sha256: dict[Path, str] = {path: e["sha256"] for path, e in zip(self.paths, finished, strict=True)}
        self._file: Any = None
        self._hash: Any = None

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def finished_tokens(self) -> int:
        return sum(entry["tokens"] for entry in self.finished)

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens) > 0:
            if self._file is None:
                self._open_next()
            room = self.shard_tokens - self.counts[-1]
            data = tokens[:room].astype(self.dtype, copy=False).tobytes()
            self._file.write(data)
            self._hash.update(data)
            self.counts[-1] += min(room, len(tokens))
            tokens = tokens[room:]
            if self.counts[-1] == self.shard_tokens:
                self._finish_file()

    def _open_next(self) -> None:
        path = self.directory / f"stream_{len(self.paths):06d}.bin"
        self._file = open(path, "wb")
        self._hash = hashlib.sha256()
        self.paths.append(path)
        self.counts.append(0)

    def _finish_file(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())  # on disk before the progress file names it
        self.close()
        path = self.paths[-1]
        self.finished.append({"file": path.name, "tokens": self.counts[-1], "sha256": self.sha256[path]})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self.sha256[self.paths[-1]] = self._hash.hexdigest()
            self._file = None


def _copy_tokens(source: Path, dtype: np.dtype, start: int, stop: int, target: Path) -> str:
    """Write tokens [start, stop) of the raw file `source` to `target`, a bounded block at a time; its sha256."""
    tokens = np.memmap(source, dtype=dtype, mode="r")
    digest = hashlib.sha256()
    with open(target, "wb") as f:
        for begin in range(start, stop, _COPY_TOKENS):
            data = np.asarray(tokens[begin : min(begin + _COPY_TOKENS, stop)]).tobytes()
            f.write(data)
            digest.update(data)
    del tokens
    return digest.hexdigest()


def _split_stream(writer: _StreamWriter, train_tokens: int, staging: Path) -> list[tuple[str, Path, int, str]]:
    """Turn the stream files into train shards (the first `train_tokens` tokens) and val shards (the rest).

    Whole stream files are renamed; only the one file holding the boundary is copied, in two parts.
    Returns (split, path, token count, sha256) per shard, in order.
    """
    shards: list[tuple[str, Path, int, str]] = []

    def next_path(split: str) -> Path:
        return staging / f"{split}_{sum(1 for s, _, _, _ in shards if s == split):06d}.bin"

    start = 0
    for path, count in zip(writer.paths, writer.counts, strict=True):
        stop = start + count
        if stop <= train_tokens or start >= train_tokens:
            split = "train" if stop <= train_tokens else "val"
            target = next_path(split)
            os.replace(path, target)
            shards.append((split, target, count, writer.sha256[path]))
        else:
            boundary = train_tokens - start
            train_path = next_path("train")
            shards.append(("train", train_path, boundary, _copy_tokens(path, writer.dtype, 0, boundary, train_path)))
            val_path = next_path("val")
            shards.append(
                ("val", val_path, count - boundary, _copy_tokens(path, writer.dtype, boundary, count, val_path))
            )
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


@dataclass(frozen=True)
class PrepareOptions:
    """What the token stream is made from beside the sources and the tokenizer, checked at construction.

    jsonl_field: the text field of JSONL and dataset records. val_fraction: the last fraction of the stream held
    out as the val split. shard_tokens: tokens per shard file (and per resumable stream file). chunk_chars: text is
    tokenized in pieces of at most this many characters. dataset, dataset_split, dataset_config: a Hugging Face
    dataset streamed after the sources. expected_tokens: about how many tokens the input holds, for the time left
    where file sizes cannot tell (a dataset).
    """

    jsonl_field: str = "text"
    val_fraction: float = 0.1
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    chunk_chars: int = DEFAULT_CHUNK_CHARS
    dataset: str | None = None
    dataset_split: str = "train"
    dataset_config: str | None = None
    expected_tokens: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}")
        for name, value in (("shard_tokens", self.shard_tokens), ("chunk_chars", self.chunk_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.expected_tokens is not None and self.expected_tokens <= 0:
            raise ValueError(f"expected_tokens must be positive or None, got {self.expected_tokens!r}")


def prepare(
    sources: Sequence[str | Path],
    out_dir: str | Path,
    tokenizer: TextTokenizer,
    options: PrepareOptions | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Tokenize text files, directories, globs, JSONL files (and optionally a HF dataset) into token shards.

    Streams: memory stays bounded however large the input, because files are read and tokenized in pieces of
    at most `options.chunk_chars` characters, cut at a whitespace boundary that cannot change the tokens (a word
    longer than a piece is cut inside, which can change the tokens at that one place: counted as forced_splits).
    Pieces are tokenized in batches with `tokenizer.encode_batch`, on all cores. Each document is preceded by
    the end-of-text token; the last `options.val_fraction` of the stream is the val split. Invalid UTF-8 is
    replaced by U+FFFD (counted per file in the manifest and warned about); empty files and empty JSONL records
    are skipped and counted. The output is byte-for-byte the same for the same inputs. Returns the manifest (also
    written to out_dir/manifest.json).

    Resumable: after a crash or an interruption, the same call keeps the stream files already finished (every
    `shard_tokens` tokens; see `gpt2.data.progress`) and continues after them, with the same result as a run
    that was never interrupted. Changed inputs or settings start over. A dataset is read again from its start
    up to the resume point (not tokenized again).

    progress: a progress bar of tokens written, tokens/s and the time left (estimated from the bytes read so far
    for files; for a dataset only when `expected_tokens` says about how many tokens it holds). log: receives
    status lines (resuming, starting over).

    >>> from gpt2.tokenizer import load_tokenizer
    >>> _ = (tmp / "input.txt").write_text("To be, or not to be: that is the question.\\n" * 100)
    >>> manifest = prepare([tmp / "input.txt"], tmp / "data", load_tokenizer(gpt2_files))
    >>> manifest["splits"]  # tokens: 100 lines of 14, an end-of-text first; the last tenth held out
    {'train': 1260, 'val': 141}
    """
    _check_tokenizer(tokenizer)
    options = PrepareOptions() if options is None else options
    if not sources and options.dataset is None:
        raise ValueError("nothing to prepare: pass at least one source (file, directory, glob) or a dataset name")
    say = log if log is not None else (lambda message: None)
    out_dir = _check_output(Path(out_dir), overwrite)
    expanded, dataset_documents = _expand(sources, options)

    dtype = token_dtype(tokenizer.vocab_size)
    key = _run_key(tokenizer, dtype, options, expanded)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / STAGING_DIR
    earlier, report = _open_staging(staging, key, dtype, expanded, say)
    writer = _StreamWriter(staging, dtype, options.shard_tokens, earlier.finished if earlier is not None else [])
    stream = _Stream(writer, staging, key, expanded, report, earlier.resume if earlier is not None else None)
    total_bytes = None if dataset_documents is not None else sum(p.stat().st_size for s in expanded for p in s.files)
    done = False
    try:
        pieces = document_pieces(
            expanded, dataset_documents, options.jsonl_field, options.chunk_chars, report,
            start_unit=stream.start_unit, on_unit=stream.unit_started,
        )  # fmt: skip
        estimate = _Estimate(progress, total_bytes, options.expected_tokens)
        _tokenize_into(stream, tokenizer, stream.unfinished(pieces), options.chunk_chars, estimate)
        manifest = _write_shards(out_dir, staging, writer, stream, _Made(tokenizer, dtype, options, expanded, report))
        done = True
    finally:
        writer.close()
        if done or not writer.finished:  # keep what a re-run can resume from, nothing else
            shutil.rmtree(staging, ignore_errors=True)
    if report.invalid_files:
        first, count = report.invalid_files[0]
        notice(
            f"{len(report.invalid_files)} file(s) had bytes that are not valid UTF-8, replaced by U+FFFD "
            f"(first: {first}, {count} replacement(s)); see 'invalid_utf8' in {out_dir / MANIFEST_NAME}"
        )
    return manifest


def _check_output(out_dir: Path, overwrite: bool) -> Path:
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"output {str(out_dir)!r} is a file; pass a directory with --out")
    if (out_dir / MANIFEST_NAME).exists() and not overwrite:
        raise FileExistsError(
            f"{str(out_dir)!r} already holds prepared data; pass overwrite=True (--overwrite) to replace it, "
            "or choose another output directory"
        )
    return out_dir


def _expand(sources: Sequence[str | Path], options: PrepareOptions) -> tuple[list[Source], Iterator[str] | None]:
    """The sources as a list (a dataset last, named with its config and split) and the dataset's documents."""
    expanded = expand_sources(sources)
    if options.dataset is None:
        return expanded, None
    documents = iter_hf_dataset(
        options.dataset, split=options.dataset_split, config=options.dataset_config, text_field=options.jsonl_field
    )
    config = f"config {options.dataset_config}, " if options.dataset_config else ""
    expanded.append(Source(f"{options.dataset} ({config}split {options.dataset_split})", "dataset"))
    return expanded, documents


def _open_staging(
    staging: Path, key: dict[str, Any], dtype: np.dtype, sources: list[Source], say: Callable[[str], None]
) -> tuple[Progress | None, Report]:
    """The staging folder ready for this run: the progress of an earlier run with the same key (its finished
    stream files kept, the sources' document counts restored) and the report to continue, or a fresh folder."""
    earlier, why = read_progress(staging, key, dtype.itemsize)
    if earlier is None:
        if staging.exists():
            say(f"starting over in {staging}: {why}")
            shutil.rmtree(staging)
        staging.mkdir()
        return None, Report()
    assert earlier.resume is not None, "a progress file is written with its resume point"
    kept = {entry["file"] for entry in earlier.finished} | {PROGRESS_NAME}
    for stale in staging.iterdir():  # the unfinished stream file of the crashed run
        if stale.name not in kept:
            stale.unlink()
    say(f"resuming: {why}, {earlier.resume.stream_tokens:,} tokens kept in {staging}")
    for source, documents in zip(sources, earlier.resume.source_documents, strict=True):
        source.documents = documents
    return earlier, report_from_dict(earlier.resume.report)


@dataclass(frozen=True)
class _Made:
    """How the stream was made: what the manifest records beside the shards."""

    tokenizer: TextTokenizer
    dtype: np.dtype
    options: PrepareOptions
    sources: list[Source]
    report: Report


def _write_shards(out_dir: Path, staging: Path, writer: _StreamWriter, stream: _Stream, made: _Made) -> dict[str, Any]:
    """Split the finished stream into train and val shards and swap them and the manifest into out_dir."""
    writer.close()
    total = writer.total
    report = made.report
    if total == 0:
        raise ValueError(
            f"the sources hold no text ({report.files} file(s), {len(report.empty_files)} empty, "
            f"{report.empty_records} empty record(s)); pass files with text in them"
        )
    for source, tokens in zip(made.sources, stream.source_tokens, strict=True):
        source.tokens = int(tokens)
    (staging / PROGRESS_NAME).unlink(missing_ok=True)  # the stream files are renamed next: nothing to resume
    train_tokens = int(total * (1.0 - made.options.val_fraction))  # nanoGPT: data[: int(n * 0.9)]
    shards = _split_stream(writer, train_tokens, staging)
    manifest = _manifest(made, train_tokens, total - train_tokens, shards)
    _replace_output(out_dir, staging, shards, manifest)
    return manifest


def _run_key(
    tokenizer: TextTokenizer, dtype: np.dtype, options: PrepareOptions, sources: list[Source]
) -> dict[str, Any]:
    """Everything the token stream depends on: a progress file with another key is not resumed."""
    return {
        "tokenizer": [tokenizer.identity, tokenizer.vocab_size, tokenizer.eot_token],
        "dtype": dtype.str,
        "shard_tokens": options.shard_tokens,
        "chunk_chars": options.chunk_chars,
        "jsonl_field": options.jsonl_field,
        "sources": [
            [s.spec, s.kind, [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in s.files]] for s in sources
        ],
    }


class _Stream:
    """The ordered end of the pipeline: appends tokenized batches to the stream files, keeps the counts the
    manifest needs, and writes the progress file each time a stream file is finished.

    Positions count the whole stream as if nothing had been skipped: a resumed run starts with the first piece
    not wholly in the finished files, at position stream_tokens - skip_tokens, and writes only its tokens from
    stream_tokens on.
    """

    def __init__(
        self, writer: _StreamWriter, staging: Path, key: dict[str, Any], sources: list[Source], report: Report,
        resume: ResumePoint | None,
    ) -> None:  # fmt: skip
        self.writer = writer
        self.staging = staging
        self.key = key
        self.sources = sources
        self.report = report
        self.resume = resume
        self.start_unit = resume.unit if resume is not None else 0
        self.position = resume.stream_tokens - resume.skip_tokens if resume is not None else 0
        self.input_bytes = resume.input_bytes if resume is not None else 0
        self.source_tokens = np.array(resume.source_tokens if resume else [0] * len(sources), dtype=np.int64)
        # unit -> (report counters, lengths of its two lists, documents per source) as the unit began; the lists
        # only grow, so their lengths are enough to restore them
        self._unit_starts: dict[int, tuple[dict[str, int], int, int, list[int]]] = {}

    def unit_started(self, unit: int) -> None:
        report = self.report
        counters = {"documents": report.documents, "files": report.files, "empty_records": report.empty_records,
                    "forced_splits": report.forced_splits}  # fmt: skip
        documents = [source.documents for source in self.sources]
        self._unit_starts[unit] = (counters, len(report.empty_files), len(report.invalid_files), documents)

    def unfinished(self, pieces: Iterable[Piece]) -> Iterator[Piece]:
        """`pieces` without those wholly in the finished stream files (a resumed run reads them, but does not
        tokenize them again)."""
        resume = self.resume
        for piece in pieces:
            if resume is not None and piece.unit == resume.unit and piece.index < resume.piece:
                continue
            yield piece

    def append(self, batch: _Encoded) -> None:
        """Append one tokenized batch to the stream files; record progress if that finished one."""
        begin = self.position
        finished_before = len(self.writer.finished)
        self.writer.write(batch.tokens[max(0, self.writer.total - begin) :])  # a resumed run's first piece
        if len(self.writer.finished) > finished_before:
            self._save_progress(begin, batch)
        np.add.at(self.source_tokens, [piece.source for piece in batch.pieces], batch.lengths)
        self.position = begin + int(batch.lengths.sum())
        self.input_bytes += int(batch.piece_bytes.sum())
        last_unit = batch.pieces[-1].unit
        for unit in [unit for unit in self._unit_starts if unit < last_unit]:
            del self._unit_starts[unit]

    def _save_progress(self, begin: int, batch: _Encoded) -> None:
        """Record the finished files and where the stream continues: the piece holding the next token."""
        boundary = self.writer.finished_tokens
        ends = begin + np.cumsum(batch.lengths)
        at = int(np.searchsorted(ends, boundary, side="left"))  # the first piece that ends at or after it
        piece = batch.pieces[at]
        source_tokens = self.source_tokens.copy()
        np.add.at(source_tokens, [p.source for p in batch.pieces[:at]], batch.lengths[:at])
        counters, empty_files, invalid_files, documents = self._unit_starts[piece.unit]
        report = {**counters, "empty_files": self.report.empty_files[:empty_files],
                  "invalid_files": [list(item) for item in self.report.invalid_files[:invalid_files]]}  # fmt: skip
        resume = ResumePoint(
            unit=piece.unit, piece=piece.index, skip_tokens=boundary - int(ends[at] - batch.lengths[at]),
            stream_tokens=boundary, input_bytes=self.input_bytes + int(batch.piece_bytes[:at].sum()),
            source_tokens=source_tokens.tolist(), source_documents=documents, report=report,
        )  # fmt: skip
        write_progress(self.staging, Progress(self.key, list(self.writer.finished), resume))


@dataclass
class _Encoded:
    """A tokenized batch: the ids of its pieces in order, each document's EOT in front of its first piece."""

    pieces: list[Piece]
    tokens: np.ndarray
    """(sum of lengths,) int64."""
    lengths: np.ndarray
    """(len(pieces),) int64: tokens per piece, its EOT included."""
    piece_bytes: np.ndarray
    """(len(pieces),) int64: UTF-8 bytes of each piece's text (for the progress estimate)."""


def _encode(tokenizer: TextTokenizer, pieces: list[Piece]) -> _Encoded:
    """Tokenize a batch of pieces with `encode_batch` (on all cores) and lay the ids out as the stream holds them."""
    ids_per_piece = tokenizer.encode_batch([piece.text for piece in pieces])
    lengths = np.array(
        [len(ids) + piece.starts_document for piece, ids in zip(pieces, ids_per_piece, strict=True)], dtype=np.int64
    )
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    at = 0
    for piece, ids in zip(pieces, ids_per_piece, strict=True):
        if piece.starts_document:
            tokens[at] = tokenizer.eot_token
            at += 1
        tokens[at : at + len(ids)] = ids
        at += len(ids)
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= tokenizer.vocab_size):
        raise ValueError(f"the tokenizer produced id {int(tokens.max())} outside its vocab_size {tokenizer.vocab_size}")
    piece_bytes = np.array([len(piece.text.encode("utf-8", "surrogatepass")) for piece in pieces], dtype=np.int64)
    return _Encoded(pieces, tokens, lengths, piece_bytes)


@dataclass(frozen=True)
class _Estimate:
    """The progress bar: shown or not, and what the time left is estimated from (all the input's bytes, or the
    tokens the caller expects)."""

    shown: bool
    total_bytes: int | None
    expected_tokens: int | None


def _tokenize_into(
    stream: _Stream, tokenizer: TextTokenizer, pieces: Iterable[Piece], chunk_chars: int, estimate: _Estimate
) -> None:
    """Tokenize the pieces in batches big enough to keep every core busy, BATCHES_IN_FLIGHT at a time while the
    next batch is read, and append them to the stream in order."""
    from tqdm.auto import tqdm

    # enough pieces per encode_batch call for the tokenizer's threads, few enough to keep memory bounded
    batch_chars = chunk_chars * max(8, 2 * (os.cpu_count() or 1))
    total_bytes, expected_tokens = estimate.total_bytes, estimate.expected_tokens
    bar = tqdm(unit="tok", unit_scale=True, desc="tokenizing", disable=not estimate.shown,
               initial=stream.writer.total, total=expected_tokens, smoothing=0.05)  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=BATCHES_IN_FLIGHT, thread_name_prefix="gpt2-prepare")
    pending: deque[Future[_Encoded]] = deque()

    def append_oldest() -> None:
        written = stream.writer.total
        stream.append(pending.popleft().result())
        if total_bytes and stream.input_bytes and expected_tokens is None:
            # tokens per byte so far, times all the bytes: the total the time left is estimated from
            bar.total = max(bar.n, round(stream.position * total_bytes / stream.input_bytes))
        bar.update(stream.writer.total - written)

    try:
        batch: list[Piece] = []
        size = 0
        for piece in pieces:
            batch.append(piece)
            size += len(piece.text)
            if size >= batch_chars:
                pending.append(pool.submit(_encode, tokenizer, batch))
                batch, size = [], 0
                if len(pending) >= BATCHES_IN_FLIGHT:
                    append_oldest()
        if batch:
            pending.append(pool.submit(_encode, tokenizer, batch))
        while pending:
            append_oldest()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()


def _manifest(
    made: _Made, train_tokens: int, val_tokens: int, shards: list[tuple[str, Path, int, str]]
) -> dict[str, Any]:
    """The manifest: everything needed to read the shards and to know how they were made. No timestamps or
    absolute paths, so the same inputs give the same bytes."""
    options, report, sources = made.options, made.report, made.sources
    return {
        **manifest_header(made.tokenizer, made.dtype),
        "document_separator": DOCUMENT_SEPARATOR,
        "val_fraction": options.val_fraction,
        "splits": {"train": train_tokens, "val": val_tokens},
        "shards": [
            {"file": path.name, "split": split, "tokens": count, "sha256": sha256}
            for split, path, count, sha256 in shards
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
        "settings": {
            "shard_tokens": options.shard_tokens,
            "chunk_chars": options.chunk_chars,
            "jsonl_field": options.jsonl_field,
        },
    }


def _replace_output(
    out_dir: Path, staging: Path, shards: list[tuple[str, Path, int, str]], manifest: dict[str, Any]
) -> None:
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
    for _, path, _, _ in shards:
        os.replace(path, out_dir / path.name)
    temporary = staging / MANIFEST_NAME
    temporary.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, old_manifest)
