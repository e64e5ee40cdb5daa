"""A `prepare` run's progress file: which stream files are finished, and where a re-run resumes after a crash.

`prepare` writes the token stream into numbered files of `shard_tokens` tokens in its staging folder. Each time
one is full it is flushed to disk and `progress.json` is replaced (atomically) with:

- `key`: what the stream depends on (tokenizer, settings, every source file with its size and mtime). A re-run
  with another key starts over.
- `finished`: per finished stream file its name, token count and sha256.
- `resume`: where the next file begins in the input: a unit (one file, or the dataset), a piece of it, and how
  many tokens of that piece the finished files already hold; plus the counts the manifest needs (documents,
  tokens per source, skipped and repaired input) as they stood, so the resumed run's manifest is byte-for-byte
  the one an uninterrupted run writes.

A re-run checks every finished file against its size and sha256 before trusting it; any mismatch starts over.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpt2.data.shards import file_sha256
from gpt2.data.sources import Report
from gpt2.runtime.files import atomic_write_text

PROGRESS_NAME = "progress.json"
PROGRESS_VERSION = 1


@dataclass
class ResumePoint:
    """Where the stream continues after the finished files (all counts as they stood at that point)."""

    unit: int
    """The unit (file, or the dataset) holding the next token; earlier units are not read again."""
    piece: int
    """The piece of that unit holding the next token; its earlier pieces are read but not tokenized."""
    skip_tokens: int
    """Tokens of that piece (its EOT included) already in the finished files."""
    stream_tokens: int
    """Tokens in the finished files."""
    input_bytes: int
    """UTF-8 bytes of the pieces before that piece (for the progress estimate)."""
    source_tokens: list[int]
    """Tokens per source of the pieces before that piece."""
    source_documents: list[int]
    """Documents per source counted before the unit began."""
    report: dict[str, Any]
    """`Report` as it stood before the unit began."""


@dataclass
class Progress:
    key: dict[str, Any]
    finished: list[dict[str, Any]] = field(default_factory=list)
    """{"file", "tokens", "sha256"} per finished stream file, in stream order."""
    resume: ResumePoint | None = None


def report_from_dict(values: dict[str, Any]) -> Report:
    return Report(
        documents=values["documents"],
        files=values["files"],
        empty_files=list(values["empty_files"]),
        empty_records=values["empty_records"],
        invalid_files=[(path, count) for path, count in values["invalid_files"]],
        forced_splits=values["forced_splits"],
    )


def write_progress(staging: Path, progress: Progress) -> None:
    """Replace the progress file atomically (the stream files it names must already be on disk)."""
    record = {"version": PROGRESS_VERSION, **asdict(progress)}
    atomic_write_text(staging / PROGRESS_NAME, json.dumps(record) + "\n")


def read_progress(staging: Path, key: dict[str, Any], itemsize: int) -> tuple[Progress | None, str]:
    """The progress of an interrupted run with this `key` whose finished files are intact, else None; and why.

    Checks each finished file's size and sha256 (reads them once).
    """
    path = staging / PROGRESS_NAME
    if not path.is_file():
        return None, "no earlier run to resume"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("version") != PROGRESS_VERSION:
            return None, f"{path} has another version"
        if record["key"] != key:
            return None, "the earlier run had other sources, settings or tokenizer"
        progress = Progress(key=record["key"], finished=record["finished"], resume=ResumePoint(**record["resume"]))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        return None, f"{path} is unreadable ({type(err).__name__})"
    for entry in progress.finished:
        file = staging / entry["file"]
        if not file.is_file() or file.stat().st_size != entry["tokens"] * itemsize:
            return None, f"finished stream file {file.name} is missing or has the wrong size"
        if file_sha256(file) != entry["sha256"]:
            return None, f"finished stream file {file.name} does not match its sha256"
    return progress, f"{len(progress.finished)} finished stream file(s) verified"
