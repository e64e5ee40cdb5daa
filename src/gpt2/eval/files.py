"""The evaluation's input files: the public HellaSwag / LAMBADA files (where they live, their sha256, the cache
folder they are fetched into) and reading them: JSONL records with their file and line, UTF-8 text.

The download itself is `gpt2.weights.hub.download_file`, the package's one network boundary.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt2.runtime.files import iter_jsonl_objects
from gpt2.weights.hub import download_file

CACHE_ENV = "GPT2_CACHE"  # where fetched evaluation files go (default ~/.cache/gpt2)

JsonlSource = str | Path | Iterable[Mapping[str, Any]]
"""A JSONL file's path, or the records themselves (already parsed, e.g. from the Hugging Face Hub)."""


@dataclass(frozen=True)
class RemoteFile:
    """One public evaluation file."""

    url: str
    filename: str
    """Its name in the cache folder."""
    sha256: str | None
    """Checked after download when known."""


DATASETS: dict[str, RemoteFile] = {
    # Rowan Zellers' official release; the val split (10,042 items) is what everyone reports.
    "hellaswag": RemoteFile(
        "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl",
        "hellaswag_val.jsonl",
        None,  # no published checksum to pin
    ),
    # Its train split (39,905 items): the pool few-shot examples are drawn from, as lm-evaluation-harness does.
    "hellaswag_train": RemoteFile(
        "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_train.jsonl",
        "hellaswag_train.jsonl",
        None,
    ),
    # OpenAI's detokenized LAMBADA test set (5,153 passages), "lambada_openai" in lm-evaluation-harness.
    "lambada": RemoteFile(
        "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl",
        "lambada_test.jsonl",
        "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226",
    ),
}


def default_cache_dir() -> Path:
    """$GPT2_CACHE/eval, by default ~/.cache/gpt2/eval."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "gpt2")).expanduser() / "eval"


def fetch_dataset(name: str, cache_dir: str | Path | None = None) -> Path:
    """Local path of a public evaluation file ("hellaswag" val, "hellaswag_train", "lambada" test), downloaded once.

    The file is written atomically (a partial download never looks complete) and checked against its sha256
    when known. Offline, raises FileNotFoundError saying where to put the file or how to pass it.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown evaluation dataset {name!r}; choose one of {', '.join(DATASETS)}")
    remote = DATASETS[name]
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = directory / remote.filename
    if path.is_file():
        return path
    try:
        return download_file(remote.url, path, sha256=remote.sha256)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{name} is not cached: {err}; or pass a local file (--data PATH)") from err


def read_jsonl(source: JsonlSource, limit: int | None) -> Iterator[tuple[str, Any]]:
    """(where, record) pairs: 'FILE:LINE' for a file (blank lines skipped), 'example N' for in-memory records;
    the first `limit` records, all by default."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be positive when given, got {limit}")
    count = 0
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{str(path)!r} does not exist or is not a file; pass the JSONL file's path")
        for where, record in iter_jsonl_objects(path):
            if limit is not None and count >= limit:
                return
            count += 1
            yield where, record
        return
    for number, item in enumerate(source):
        if limit is not None and count >= limit:
            return
        count += 1
        yield f"example {number}", item


def reusable(source: JsonlSource) -> JsonlSource:
    """`source` in a form that can be read more than once: a path as it is, records (maybe a one-pass iterator)
    as a list. Few-shot evaluation reads a source twice: the questions, and the pool their examples come from."""
    return source if isinstance(source, (str, os.PathLike)) else list(source)


def describe_source(source: JsonlSource) -> str:
    """How error messages name a source: its path, or 'the records'."""
    return str(source) if isinstance(source, (str, os.PathLike)) else "the records"


def require_field(record: Any, name: str, kind: type, where: str, hint: str) -> Any:
    """record[name], refused with a ValueError naming `where` unless the record is a JSON object whose field
    `name` has type `kind` (a JSON true/false never passes for a number)."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}; {hint}")
    if name not in record:
        raise ValueError(f"{where}: missing field {name!r}; {hint}")
    value = record[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: field {name!r} must be {kind.__name__}, got {type(value).__name__}; {hint}")
    return value


def read_text(path: str | Path) -> str:
    """A UTF-8 text file's contents; a file that is not UTF-8 is a ValueError naming the byte."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{str(path)!r} is not UTF-8 text (byte {err.start}); convert it or prepare it first") from err
