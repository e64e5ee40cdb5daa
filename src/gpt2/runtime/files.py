"""Writing files so that a crash never leaves half of one: write a temporary file beside it, then rename."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` to write to; synced and renamed onto `path` only when the block finishes,
    so a crash or an error never leaves half a file under the real name. The file gets the permissions an
    ordinary `open(path, "w")` would (0o666 less the umask), not mkstemp's private 0o600."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give the path of the file to write, e.g. {path / 'out.bin'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        yield Path(temporary)
        with open(temporary, "rb+") as file:
            os.fsync(file.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder beside `path` to fill; when the block finishes, a new directory appears at `path` complete,
    or, into an existing directory, each top-level item is moved in whole. An error leaves `path` as it was."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; give the path of a directory to write into")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield staging
        if not path.exists():
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private (0o700)
            os.replace(staging, path)
            return
        for item in sorted(staging.iterdir()):
            target = path / item.name
            if item.is_dir() and target.is_dir():
                shutil.rmtree(target)  # a folder is replaced as a whole, never merged with an older one
            os.replace(item, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through `atomic_output`."""
    with atomic_output(path) as temporary:
        temporary.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text (newlines written as given)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_copy_file(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Copy `source` to `path` through `atomic_output`."""
    with atomic_output(path) as temporary:
        shutil.copyfile(source, temporary)


def iter_jsonl_objects(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """("file:line", record) for each non-blank line of a JSONL file; a line that is not a JSON object is a
    ValueError naming file:line."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg}); each line must be one JSON object") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record
