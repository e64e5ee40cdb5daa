"""`prepare`: text files, directories, globs, JSONL (and optionally a Hugging Face dataset) -> token shards.

The pipeline: expand the sources (`gpt2.data.sources`), read every document and cut it into pieces, tokenize
the pieces in batches on all cores, append the ids (each document preceded by the end-of-text token) to
numbered stream files in a staging folder, split the stream into train and val shards, then swap the shards and
the manifest (`gpt2.data.shards`, which describes the format) into the output folder, manifest last.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpt2.data.shards import (
    DOCUMENT_SEPARATOR,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    file_sha256,
    token_dtype,
)
from gpt2.data.sources import Report, Source, document_pieces, expand_sources
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights.hub import iter_hf_dataset

DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's shard size: 200 MB of uint16 per file
DEFAULT_CHUNK_CHARS = 1 << 18  # text is tokenized in pieces of at most this many characters
MAX_LISTED_FILES = 100  # the manifest names at most this many empty / repaired files (all are counted)
_COPY_TOKENS = 1 << 22  # tokens per read when splitting shards: bounded memory


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
    for path, count in zip(writer.paths, writer.counts, strict=True):
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

    >>> from gpt2.tokenizer import load_tokenizer                               # doctest: +SKIP
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
        expanded.append(Source(described, "dataset"))

    dtype = token_dtype(tokenizer.vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / ".prepare-staging"
    if staging.exists():  # left behind by an interrupted run
        shutil.rmtree(staging)
    staging.mkdir()
    report = Report()
    writer = _StreamWriter(staging, dtype, shard_tokens)
    try:
        pieces = document_pieces(expanded, dataset_documents, jsonl_field, chunk_chars, report)
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
            tokenizer,
            dtype,
            val_fraction,
            shard_tokens,
            chunk_chars,
            jsonl_field,
            train_tokens,
            total - train_tokens,
            shards,
            expanded,
            report,
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
    sources: list[Source],
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
        for (index, starts_document, _), ids in zip(batch, ids_per_piece, strict=True):
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
    sources: list[Source],
    report: Report,
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
            {"file": path.name, "split": split, "tokens": count, "sha256": file_sha256(path)}
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
