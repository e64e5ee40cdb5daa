"""Token data: the shard format and manifest, the batch loader, the prepare pipeline, built-in corpora.

Where each thing lives: `shards` (the on-disk format, `read_manifest`, `load_split`, `save_token_shards`), `view`
(`TokenView`: a split's stream over its memory-mapped shards), `loader` (`BatchLoader`), `sources` (which files a
source names, reading them as documents, cutting text into pieces), `prepare` (text -> shards + manifest,
resumable), `progress` (prepare's progress file: what a crashed run finished), `corpus` (the built-in stdlib
corpus), `cache` (a training run's data folder).
"""

from gpt2.data.loader import BatchLoader
from gpt2.data.prepare import DEFAULT_CHUNK_CHARS, DEFAULT_SHARD_TOKENS, PrepareOptions, prepare
from gpt2.data.shards import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    load_split,
    read_manifest,
    save_token_shards,
    token_dtype,
)
from gpt2.data.sources import TEXT_SUFFIXES, expand_sources
from gpt2.data.view import TokenView

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "DEFAULT_SHARD_TOKENS",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "TEXT_SUFFIXES",
    "BatchLoader",
    "TokenView",
    "expand_sources",
    "load_split",
    "PrepareOptions",
    "prepare",
    "read_manifest",
    "save_token_shards",
    "token_dtype",
]
