"""Token shards on disk: the format `gpt2.data.prepare` writes, `load_split`, which reads a split back as a
`TokenView` over its memory-mapped shards, and `save_token_shards` for token arrays made elsewhere.

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
`data[int(n * 0.9):]`), so a single text file gets a val split too. Shards are cut at a fixed token count, not
at document boundaries: a split is one stream, and its shards are consecutive pieces of it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpt2.data.view import TokenView
from gpt2.runtime.files import atomic_write_text
from gpt2.tokenizer.protocol import TextTokenizer

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


def load_split(data_dir: str | Path, split: str, *, verify: bool = False) -> TokenView:
    """The token stream of `split` ("train" or "val") of a folder written by `prepare`, as a `TokenView`.

    Every shard is memory-mapped (read-only) and nothing is loaded, so this costs the same for a 1 MB and a
    1 TB split; `view[i:j]` reads those tokens only (see `gpt2.data.view`). Sizes are checked against the
    manifest; `verify=True` also checks every shard's sha256 (reads every byte once).

    >>> import numpy as np
    >>> from gpt2.tokenizer import load_tokenizer
    >>> _ = save_token_shards(tmp / "data", {"train": [np.arange(100), np.arange(50)]}, load_tokenizer("bytes"))
    >>> tokens = load_split(tmp / "data", "train")
    >>> len(tokens), tokens.dtype, tokens[98:102].tolist()  # the two shards read as one stream
    (150, dtype('uint16'), [98, 99, 0, 1])
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
    return TokenView(arrays, dtype=dtype)


def save_token_shards(
    out_dir: str | Path, splits: Mapping[str, Sequence[np.ndarray]], tokenizer: TextTokenizer
) -> dict[str, Any]:
    """Write token arrays you already have as a prepared folder: each array of `splits[name]` becomes one shard
    `{name}_{k:06d}.bin`, then the manifest (written last). `load_split` and training read it like the output of
    `prepare`; use it for tokens made elsewhere or for synthetic corpora (tests, benchmarks). Returns the manifest.

    >>> import numpy as np
    >>> from gpt2.tokenizer import load_tokenizer
    >>> ids = np.random.default_rng(0).integers(0, 256, size=3000)
    >>> manifest = save_token_shards(tmp / "synthetic", {"train": [ids[:2000], ids[2000:2700]], "val": [ids[2700:]]},
    ...                              load_tokenizer("bytes"))
    >>> manifest["splits"]
    {'train': 2700, 'val': 300}
    """
    out_dir = Path(out_dir)
    if (out_dir / MANIFEST_NAME).exists():
        raise FileExistsError(f"{str(out_dir)!r} already holds prepared data; choose another directory")
    dtype = token_dtype(tokenizer.vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards, counts = [], {}
    for split, arrays in splits.items():
        counts[split] = 0
        for index, array in enumerate(arrays):
            array = np.asarray(array)
            if array.ndim != 1 or (array.size and (array.min() < 0 or array.max() >= tokenizer.vocab_size)):
                raise ValueError(
                    f"split {split!r} array {index} must be 1-D ids in [0, {tokenizer.vocab_size}), got shape "
                    f"{array.shape}" + (f" and ids {array.min()}..{array.max()}" if array.size else "")
                )
            path = out_dir / f"{split}_{index:06d}.bin"
            array.astype(dtype).tofile(path)
            shards.append({"file": path.name, "split": split, "tokens": len(array), "sha256": file_sha256(path)})
            counts[split] += len(array)
    manifest = {**manifest_header(tokenizer, dtype), "splits": counts, "shards": shards}
    atomic_write_text(out_dir / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
    return manifest


def manifest_header(tokenizer: TextTokenizer, dtype: np.dtype) -> dict[str, Any]:
    """The manifest fields that say how to read the shards: format, version, tokenizer identity, dtype."""
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
    }


def file_sha256(path: Path) -> str:
    """The sha256 of a file (hex), read in bounded blocks: the checksum the manifest records per shard."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()
