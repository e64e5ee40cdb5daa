"""The text that goes into `gpt2.data.prepare`: sources expanded to files, files read as documents, and
documents cut into pieces that tokenize exactly as the whole.

A source is a text file, a .jsonl file (one document per record), a directory (searched recursively) or a glob;
a Hugging Face dataset is read by `gpt2.weights.hub.iter_hf_dataset` (the one module that reaches the network)
and joins the stream here as the last source. Invalid UTF-8 is replaced by U+FFFD and counted, empty files and
records are skipped and counted, in a `Report` that ends up in the manifest.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Suffixes a directory source contributes (anything else needs an explicit file or glob); .jsonl is parsed.
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".jsonl")


@dataclass
class Source:
    """One source as the caller named it, the files it expanded to (sorted), and what `prepare` read from it."""

    spec: str
    kind: str  # "file", "directory", "glob" or "dataset"
    files: list[Path] = field(default_factory=list)
    documents: int = 0
    tokens: int = 0


def expand_sources(sources: Sequence[str | Path]) -> list[Source]:
    """Expand files, directories (recursively: files ending in TEXT_SUFFIXES, hidden ones skipped) and globs.

    Order is the caller's order of sources, and sorted paths within a directory or glob, so the token stream
    is the same on every machine. A source that matches nothing is a FileNotFoundError naming it.
    """
    expanded = []
    for spec in sources:
        text = str(spec)
        path = Path(text).expanduser()
        if path.is_file():
            expanded.append(Source(text, "file", [path]))
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
            expanded.append(Source(text, "directory", files))
        elif re.search(r"[*?\[]", text):
            matches = sorted(glob.glob(os.path.expanduser(text), recursive=True))
            files = [Path(m) for m in matches if Path(m).is_file()]
            if not files:
                raise FileNotFoundError(f"source glob {text!r} matches no files; check the pattern and the directory")
            expanded.append(Source(text, "glob", files))
        else:
            raise FileNotFoundError(f"source {text!r} does not exist; pass a text file, .jsonl file, directory or glob")
    return expanded


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
class Report:
    """What reading the sources skipped or repaired; the readers here count, `prepare` writes it to the manifest."""

    documents: int = 0
    files: int = 0
    empty_files: list[str] = field(default_factory=list)
    empty_records: int = 0
    invalid_files: list[tuple[str, int]] = field(default_factory=list)
    forced_splits: int = 0


def _cut_point(text: str, limit: int, report: Report) -> int:
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


def _pieces(blocks: Iterable[str], chunk_chars: int, report: Report) -> Iterator[str]:
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


def _text_file_blocks(path: Path, block_bytes: int, report: Report) -> Iterator[str]:
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


def _jsonl_documents(path: Path, text_field: str, report: Report) -> Iterator[str]:
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


@dataclass(frozen=True)
class Piece:
    """A piece of a document, as `document_pieces` yields them in stream order."""

    source: int
    """Index of its source in the expanded list."""
    unit: int
    """Which file it comes from, counted over all sources in stream order (a dataset is the last unit): the
    place a resumed `prepare` starts reading again."""
    index: int
    """Its number among the pieces of its unit."""
    starts_document: bool
    text: str


def document_pieces(
    sources: list[Source],
    dataset_documents: Iterable[str] | None,
    text_field: str,
    chunk_chars: int,
    report: Report,
    *,
    start_unit: int = 0,
    on_unit: Callable[[int], None] | None = None,
) -> Iterator[Piece]:
    """Every piece of every document, in stream order.

    Units (files, then the dataset) before `start_unit` are passed over without being opened or counted: a
    resumed run restores their counts from its progress file. `on_unit(unit)` is called as each unit begins,
    before anything of it is counted in `report` or the sources.
    """
    unit = -1
    for index, source in enumerate(sources):
        for path in source.files:
            unit += 1
            if unit < start_unit:
                continue
            if on_unit is not None:
                on_unit(unit)
            report.files += 1
            if path.stat().st_size == 0:
                report.empty_files.append(str(path))
                continue
            if path.suffix.lower() == ".jsonl":
                documents: Iterable[Iterable[str]] = ([text] for text in _jsonl_documents(path, text_field, report))
            else:
                documents = [_text_file_blocks(path, chunk_chars, report)]
            number = 0
            for blocks in documents:
                source.documents += 1
                report.documents += 1
                for piece_number, piece in enumerate(_pieces(blocks, chunk_chars, report)):
                    yield Piece(index, unit, number, piece_number == 0, piece)
                    number += 1
    if dataset_documents is not None:
        unit += 1
        if unit < start_unit:
            return
        if on_unit is not None:
            on_unit(unit)
        index = len(sources) - 1  # the dataset is the last source
        number = 0
        for text in dataset_documents:
            if not text:
                report.empty_records += 1
                continue
            sources[index].documents += 1
            report.documents += 1
            for piece_number, piece in enumerate(_pieces([text], chunk_chars, report)):
                yield Piece(index, unit, number, piece_number == 0, piece)
                number += 1
