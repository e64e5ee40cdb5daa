"""A training run's data cache: tokenize the run's corpus once (training a BPE for it when asked) into a folder,
and reuse that folder while the corpus and the tokenizer settings stay the same.

The folder holds the prepared shards and manifest (see `gpt2.data.prepare`), the tokenizer in `tokenizer/`,
and `source.json`: the settings and source file sizes it was made from, written last, so its presence means
the folder is complete. A folder whose `source.json` differs is made again.

    >>> _ = (tmp / "input.txt").write_text("To be, or not to be: that is the question.\\n" * 100)
    >>> spec = DataSpec(data=str(tmp / "input.txt"), tokenizer="bpe", vocab_size=270)  # or data="stdlib"
    >>> tokenizer, data_dir = prepare_data(spec, tmp / "run" / "data")
    >>> tokenizer.vocab_size, sorted(path.name for path in data_dir.iterdir())
    (270, ['manifest.json', 'source.json', 'tokenizer', 'train_000000.bin', 'val_000000.bin'])
    >>> prepare_data(spec, tmp / "run" / "data")[1] == data_dir  # the same settings: the folder is reused
    True
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpt2.data.corpus import stdlib_files
from gpt2.tokenizer import TextTokenizer, load_tokenizer, train_tokenizer

SOURCE_KEY_FILE = "source.json"
TOKENIZER_DIR = "tokenizer"
STDLIB = "stdlib"
TRAIN_A_BPE = "bpe"


@dataclass(frozen=True)
class DataSpec:
    """What a run trains on (TrainConfig's data fields, which the training config passes in)."""

    data: str
    """'stdlib' (this Python's standard library source), a text file or folder of text files, or a folder
    prepared by `gpt2 prepare` (has manifest.json), which is used as it is."""
    tokenizer: str
    """'bpe' (train one of `vocab_size` ids on the corpus), 'bytes', or a tokenizer directory / Hub name."""
    vocab_size: int = 4096
    """Ids of the BPE trained when tokenizer='bpe' (ignored otherwise)."""
    max_corpus_bytes: int | None = None
    """data='stdlib' only: the first corpus files up to this many bytes."""
    val_fraction: float = 0.1
    """The last fraction of the token stream held out as the val split."""

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("data must not be empty; pass data=stdlib, a text file or a prepared folder")
        if self.tokenizer == TRAIN_A_BPE and self.vocab_size < 257:
            raise ValueError(f"vocab_size must be at least 257 (256 bytes + <|endoftext|>), got {self.vocab_size}")
        if self.max_corpus_bytes is not None and self.max_corpus_bytes <= 0:
            raise ValueError(f"max_corpus_bytes must be a positive integer or unset, got {self.max_corpus_bytes}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")


def prepare_data(spec: DataSpec, cache_dir: Path, *, progress: bool = False) -> tuple[TextTokenizer, Path]:
    """(tokenizer, prepared data folder) for `spec`. A folder already prepared by `gpt2 prepare` is used in
    place (its tokenizer must match); otherwise the corpus is tokenized into `cache_dir`, unless an earlier
    call with the same settings and source files already did."""
    # imported here: gpt2.data's __init__ may re-export this module, so its names are read once it is complete
    from gpt2.data import MANIFEST_NAME, PrepareOptions, prepare, read_manifest

    data_path = Path(spec.data)
    if spec.data != STDLIB and (data_path / MANIFEST_NAME).is_file():
        tokenizer = _load_tokenizer(spec.tokenizer, purpose=f"data={spec.data} (already tokenized)")
        identity = read_manifest(data_path)["tokenizer"]["identity"]
        if identity != tokenizer.identity:
            raise ValueError(
                f"{spec.data} was tokenized with {identity}, but tokenizer={spec.tokenizer!r} is "
                f"{tokenizer.identity}; pass the tokenizer the data was prepared with"
            )
        return tokenizer, data_path

    sources = _source_files(spec)
    key = {
        "data": spec.data,
        "tokenizer": spec.tokenizer,
        "vocab_size": spec.vocab_size if spec.tokenizer == TRAIN_A_BPE else None,
        "val_fraction": spec.val_fraction,
        "sources": [[str(path), path.stat().st_size] for path in sources if path.is_file()],
    }
    key_path = cache_dir / SOURCE_KEY_FILE
    if key_path.is_file() and (cache_dir / MANIFEST_NAME).is_file() and json.loads(key_path.read_text()) == key:
        return _load_tokenizer(str(cache_dir / TOKENIZER_DIR), purpose="the tokenizer of this run's data"), cache_dir

    if spec.tokenizer == TRAIN_A_BPE:
        tokenizer = train_tokenizer(sources, spec.vocab_size)
    else:
        tokenizer = _load_tokenizer(spec.tokenizer, purpose="tokenizing the data")
    if cache_dir.exists():
        shutil.rmtree(cache_dir)  # made from other settings; the key file says this folder is ours to replace
    prepare(sources, cache_dir, tokenizer, PrepareOptions(val_fraction=spec.val_fraction), progress=progress)
    tokenizer.save(cache_dir / TOKENIZER_DIR)
    key_path.write_text(json.dumps(key, indent=1) + "\n")  # written last: its presence means the folder is done
    return tokenizer, cache_dir


def _source_files(spec: DataSpec) -> list[Path]:
    """The files (or the one folder) to tokenize for `spec`."""
    if spec.data == STDLIB:
        return stdlib_files(spec.max_corpus_bytes)
    data_path = Path(spec.data)
    if not data_path.exists():
        raise FileNotFoundError(
            f"training data {spec.data!r} does not exist; pass data=PATH (a text file, a folder of text "
            "files, or a folder prepared by `gpt2 prepare`), or data=stdlib for the built-in corpus"
        )
    if spec.max_corpus_bytes is not None:
        raise ValueError("max_corpus_bytes applies to data=stdlib only; cut your text file instead")
    return [data_path]


def _load_tokenizer(spec: str, purpose: str) -> TextTokenizer:
    if spec == TRAIN_A_BPE:
        raise ValueError(f"tokenizer='bpe' (train one) cannot be used for {purpose}; pass the tokenizer directory")
    return load_tokenizer(spec)
