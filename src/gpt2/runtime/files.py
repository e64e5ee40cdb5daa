"""Writing files so that a crash never leaves half of one: write a temporary file beside it, then rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory and an atomic rename. The file gets
    the permissions an ordinary `open(path, "w")` would (0o666 less the umask), not mkstemp's private 0o600."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text (newlines written as given)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_copy_file(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Copy `source` to `path` through a temporary file beside `path` and an atomic rename."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        shutil.copyfile(source, temporary)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
