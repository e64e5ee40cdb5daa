"""The built-in training corpus: the Python standard library source of the running interpreter.

Every machine that runs gpt2 has it, so `gpt2 train` (preset "stdlib") needs no download. About 9 MB of
Python in ~520 files (CPython 3.11) once test suites, demos, bundled third-party code and the two folders that
are data rather than code (encodings: 1.4 MB of codec tables; pydoc_data: 0.75 MB of help text) are left out.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

# Folders of tests, demos, GUI tooling, installed third-party packages, or data written as Python (codec
# tables, help text): a small model trained on those learns tables, not code.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idlelib", "site-packages", "dist-packages", "turtledemo", "ensurepip", "__pycache__",
    "encodings", "pydoc_data",
})  # fmt: skip
FILE_ORDER_SEED = 20191105  # the file order is shuffled with this seed, so the val split (the last 10% of the
# stream) is a random sample of modules rather than the alphabetically last ones (xml, zipfile, ...)


def stdlib_root() -> Path:
    """The directory of the running interpreter's standard library (sysconfig's "stdlib" path)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library directory {str(root)!r} does not exist; pass data=PATH")
    return root


def stdlib_files(max_bytes: int | None = None, *, root: Path | None = None) -> list[Path]:
    """The corpus files: *.py under the stdlib, without tests/idlelib/site-packages etc., in a fixed shuffled
    order.

    `max_bytes` cuts that order: the result is its longest prefix whose file sizes add up to at most `max_bytes`
    (the first file alone when it is already larger). It stops at the first file that does not fit rather than
    skipping it for smaller later ones, so a trial with `max_corpus_bytes` trains on the beginning of exactly
    the stream the full run sees, a larger budget only appends files, and small modules are not over-sampled.

    >>> files = stdlib_files(max_bytes=100_000)
    >>> files == stdlib_files()[: len(files)]
    True
    >>> sum(f.stat().st_size for f in files) <= 100_000 or len(files) == 1
    True
    """
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive or None, got {max_bytes}")
    root = stdlib_root() if root is None else root
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in parts):
            continue
        if path.is_file():
            files.append(path)
    if not files:
        raise FileNotFoundError(f"no *.py files under {str(root)!r}; pass data=PATH to train on your own text")
    random.Random(FILE_ORDER_SEED).shuffle(files)
    if max_bytes is None:
        return files
    kept: list[Path] = []
    total = 0
    for path in files:
        total += path.stat().st_size
        if kept and total > max_bytes:
            break
        kept.append(path)
    return kept
