"""Token data: the shard format and manifest, the batch loader, the prepare pipeline, built-in corpora.

Where each thing lives: `shards` (the on-disk format, `read_manifest`, `load_split`), `loader` (`BatchLoader`),
`sources` (which files a source names, reading them as documents, cutting text into pieces), `prepare` (text ->
shards + manifest), `corpus` (the built-in stdlib corpus).
"""

from gpt2.data.loader import BatchLoader
from gpt2.data.prepare import DEFAULT_CHUNK_CHARS, DEFAULT_SHARD_TOKENS, prepare
from gpt2.data.shards import MANIFEST_FORMAT, MANIFEST_NAME, MANIFEST_VERSION, load_split, read_manifest, token_dtype
from gpt2.data.sources import TEXT_SUFFIXES, expand_sources

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "DEFAULT_SHARD_TOKENS",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "TEXT_SUFFIXES",
    "BatchLoader",
    "expand_sources",
    "load_split",
    "prepare",
    "read_manifest",
    "token_dtype",
]
