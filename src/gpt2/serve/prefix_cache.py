"""Automatic prefix caching: the keys and values of earlier prompts, kept in blocks of `BLOCK_TOKENS` tokens, so
that a prompt starting with the same tokens (a shared system prompt, a few-shot header, a chat's earlier turns)
skips prefilling them (vLLM's automatic prefix caching, llama-server's prompt reuse).

Notation: n_layer layers, nh heads, hs = head size, T = tokens.

Keys. Block i of a prompt (its tokens [i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS)) is stored under a hash chain,
as vLLM keys its blocks: key_i = H(key_{i-1}, tokens of block i). A key thus names every token up to the block's
end, and that is all its K/V depend on: the batch feeds each sequence its own position ids 0, 1, ... whatever
column it sits in (gpt2.serve.batch), so a prefix's K/V are the same in every prompt that starts with it. H is
128-bit BLAKE2b: two prefixes sharing a key (which would serve one the other's K/V) is not a practical concern.
Only full blocks are stored, and only prompts' blocks: generated tokens' K/V come from decode steps, which some
precisions compute with other kernels than a prefill (so reusing them would change what a prompt computes).

Memory. At most `max_bytes` of blocks (keys and values together), on the device of the K/V given. The least
recently used block goes first. A lookup or an insert uses a prompt's blocks from the last to the first, so a
prompt's first block is its most recent: a prefix loses its tail before its head, and what stays is still a prefix.
A block whose parent was evicted stays until it ages out too; it is found again once the parent is re-inserted.

Counters, for /metrics (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens): `queries` (prompt tokens
looked up), `hits` (of those, tokens whose K/V came from here instead of a prefill), `evictions` (blocks).
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK_TOKENS = 16  # tokens per block: vLLM's default; a prompt reuses its cached prefix in steps of this many
KEY_BYTES = 16  # the hash chain's digest size (128 bits)


@dataclass(frozen=True)
class _Block:
    k: torch.Tensor  # (n_layer, nh, BLOCK_TOKENS, hs)
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass(frozen=True)
class CachedPrefix:
    """The cached blocks a prompt starts with (maybe none); `length` tokens in all."""

    blocks: tuple[_Block, ...]
    block_tokens: int

    @property
    def length(self) -> int:
        return len(self.blocks) * self.block_tokens

    def copy_into(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K and V of the first `tokens` (<= length) tokens into k and v, each (n_layer, nh, tokens, hs),
        block by block: no concatenated copy in between (at 700 tokens of the 124M model one costs ~10 ms)."""
        tokens = k.shape[2]
        assert 0 < tokens <= self.length, f"{tokens} tokens asked of a cached prefix of {self.length}"
        for start, block in zip(range(0, tokens, self.block_tokens), self.blocks, strict=False):
            end = min(start + self.block_tokens, tokens)
            k[:, :, start:end] = block.k[:, :, : end - start]
            v[:, :, start:end] = block.v[:, :, : end - start]


class PrefixCache:
    """K/V blocks of earlier prompts under a byte budget, least recently used evicted first (module docstring).

    >>> cache = PrefixCache(max_bytes=1 << 20)
    >>> k = v = torch.zeros(2, 2, 40, 16)  # (n_layer, nh, T, hs): a prompt of 40 tokens
    >>> cache.insert(list(range(40)), k, v)  # its 2 full blocks
    >>> cache.lookup([*range(40), 7]).length  # a prompt that starts with them
    32
    """

    def __init__(self, max_bytes: int, *, block_tokens: int = BLOCK_TOKENS) -> None:
        for name, value in (("max_bytes", max_bytes), ("block_tokens", block_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._blocks: collections.OrderedDict[bytes, _Block] = collections.OrderedDict()  # least recent first
        self.bytes = 0  # held now
        self.queries = 0
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    def lookup(self, tokens: Sequence[int]) -> CachedPrefix:
        """The longest cached prefix of `tokens` in whole blocks (used: it becomes the most recent)."""
        found = []
        for key in self._keys(tokens, len(tokens) // self.block_tokens):
            block = self._blocks.get(key)
            if block is None:
                break
            found.append(key)
        self._use(found)
        return CachedPrefix(tuple(self._blocks[key] for key in found), self.block_tokens)

    def insert(self, tokens: Sequence[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep the full blocks of a prefilled prompt: `tokens` (T) and their K, V (n_layer, nh, T, hs), copied.
        Blocks already held are only used; a prompt longer than the budget keeps its first blocks."""
        T = len(tokens)
        assert k.shape == v.shape and k.shape[2] == T, f"K/V {tuple(k.shape)} do not match {T} tokens"
        if T < self.block_tokens:
            return
        block_bytes = 2 * k[:, :, : self.block_tokens].numel() * k.element_size()
        count = min(T // self.block_tokens, self.max_bytes // block_bytes)
        keys = self._keys(tokens, count)
        for i, key in enumerate(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            # this prompt's blocks are the most recent and fit the budget together: never evicted here
            while self.bytes + block_bytes > self.max_bytes:
                _, evicted = self._blocks.popitem(last=False)
                self.bytes -= evicted.nbytes
                self.evictions += 1
            span = slice(i * self.block_tokens, (i + 1) * self.block_tokens)
            self._blocks[key] = _Block(k[:, :, span].clone(), v[:, :, span].clone())
            self.bytes += block_bytes
        self._use(keys)

    def record(self, queried: int, reused: int) -> None:
        """Count a prompt's lookup: `queried` tokens looked up, `reused` of them not prefilled."""
        assert 0 <= reused <= queried
        self.queries += queried
        self.hits += reused

    def _keys(self, tokens: Sequence[int], count: int) -> list[bytes]:
        """The hash-chain keys of the first `count` blocks of `tokens`."""
        keys, key = [], b""
        for i in range(count):
            block = array("q", tokens[i * self.block_tokens : (i + 1) * self.block_tokens])
            key = hashlib.blake2b(key + block.tobytes(), digest_size=KEY_BYTES).digest()
            keys.append(key)
        return keys

    def _use(self, keys: list[bytes]) -> None:
        """Mark a prompt's blocks most recent, its first block last (so its tail is evicted before its head)."""
        for key in reversed(keys):
            self._blocks.move_to_end(key)
