"""Token shards on disk: the format `gpt2.data.prepare` writes, and `load_split`, which reads it back.

One folder per prepared corpus, `MANIFEST_VERSION` 1:

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

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "gpt2-token-shards"
MANIFEST_VERSION = 1
DOCUMENT_SEPARATOR = "eot_before_each_document"


def token_dtype(vocab_size: int) -> np.dtype:
    """The on-disk dtype for ids below `vocab_size`: little-endian uint16 when they fit, else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


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
        raise ValueError(f"{str(data_dir)!r} has no split {split!r}; it has: {', '.join(manifest['splits']) or 'none'}")
    dtype = np.dtype("<u2") if manifest["dtype"] == "uint16" else np.dtype("<u4")
    arrays = []
    for shard in manifest["shards"]:
        if shard["split"] != split:
            continue
        path = data_dir / shard["file"]
        if not path.is_file():
            raise FileNotFoundError(f"shard {str(path)!r} listed in the manifest is missing; prepare the data again")
        expected = shard["tokens"] * dtype.itemsize
        actual = path.stat().st_size
        if actual != expected:
            raise ValueError(
                f"shard {str(path)!r} has {actual} bytes but the manifest says {shard['tokens']} "
                f"{manifest['dtype']} tokens = {expected} bytes; the file is truncated or from another run: "
                "prepare the data again"
            )
        if verify and file_sha256(path) != shard["sha256"]:
            raise ValueError(f"shard {str(path)!r} does not match its sha256 in the manifest; prepare the data again")
        if shard["tokens"] > 0:
            arrays.append(np.memmap(path, dtype=dtype, mode="r", shape=(shard["tokens"],)))
    if not arrays:
        return np.zeros(0, dtype=dtype)
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays)


def file_sha256(path: Path) -> str:
    """The sha256 of a file (hex), read in bounded blocks: the checksum the manifest records per shard."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()
