"""Reading GGUF files (llama.cpp's format) through the `gguf` package, llama.cpp's own reader: the one place that
imports it for reading, so a missing package and a file that is not GGUF are each one clear error."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "pip install 'gpt2-faithful[gguf]' (or: pip install gguf)"


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file that starts with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        return file.read(4) == GGUF_MAGIC


def gguf_package() -> Any:
    try:
        import gguf
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"reading or writing GGUF files needs the gguf package: {INSTALL_HINT}") from err
    return gguf


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """A `gguf.GGUFReader` over `path` (memory-mapped: nothing is read until used)."""
    gguf = gguf_package()
    try:
        return gguf.GGUFReader(os.fspath(path))
    except Exception as err:  # the reader raises whatever its parsing hits on a truncated or corrupt file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path} is not a readable GGUF file ({first}); convert or download it again") from None


def gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    """The value of metadata `key` (a number, a string or a list), or `default` when the file lacks it."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()
