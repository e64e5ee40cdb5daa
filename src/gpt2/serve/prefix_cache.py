"""Automatic prefix caching: the keys and values of earlier prompts, kept in blocks of `BLOCK_TOKENS` tokens, so
that a prompt starting with the same tokens (a shared system prompt, a few-shot header, a chat's earlier turns)
skips prefilling them (vLLM's automatic prefix caching, llama-server's prompt reuse).

Notation: n_layer layers, nh heads, hs = head size, T = tokens, B = BLOCK_TOKENS.

Keys. Block i of a prompt (its tokens [i * B, (i + 1) * B)) is stored under a hash chain, as vLLM keys its blocks:
key_i = H(key_{i-1}, tokens of block i), from key_{-1} = the prompt's namespace (b"" for the base model; a LoRA
adapter's own key for a prompt decoded with it, whose K/V the adapter changes: gpt2.inference.lora_batch). A key
thus names the namespace and every token up to the block's end, and that is all its K/V depend on: the batch
feeds each sequence its own position ids 0, 1, ... whatever column it sits in
(gpt2.serve.batch), so a prefix's K/V are the same in every prompt that starts with it. H is 128-bit BLAKE2b: two
prefixes sharing a key (which would serve one the other's K/V) is not a practical concern. A prompt's last, partial
block (its T mod B last tokens) is stored too, under the same chain over its fewer tokens.

Lookup. Whole blocks are followed down the chain as long as the prompt's next B tokens have one; where they do not,
the blocks stored under the last one found (whole or partial) lend their first tokens as far as they agree with
the prompt's. So a prompt reuses every token it shares with an earlier one, not only whole blocks (llama-server
reuses a slot's cache token by token too): a chat's next turn reuses all of its previous prompt, a repeated prompt
all but its last token (which is prefilled for the logits). Only prompts' tokens are stored: generated tokens' K/V come
from decode steps, which some precisions compute with other kernels than a prefill (so reusing them would change
what a prompt computes).

Memory. The blocks live in one pool of max_bytes // (a block's bytes) blocks of keys and values, allocated and
zero-filled once (`reserve`: when the batch is made, or at the first insert), as vLLM keeps a block pool: an
insert copies into a free block, eviction frees one, and no prompt allocates or first touches memory (blocks
allocated one by one cost a 64-token float32 prompt of the 124M model 1-6 ms of page faults on a 2-core AMD EPYC,
against 0.06 ms for the copy). A prompt's last, partial block takes a whole block. The least recently used block goes
first. A lookup or an insert uses a prompt's blocks from the last to the first, so a prompt's first block is its
most recent: a prefix loses its tail before its head, and what stays is still a prefix. A block whose parent was
evicted stays until it ages out too; it is found again once the parent is re-inserted. A looked-up prefix is
copied out before the next insert, which may give its blocks to other tokens.

Counters, for /metrics (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens): `queries` (prompt tokens
looked up), `hits` (of those, tokens whose K/V came from here instead of a prefill), `evictions` (blocks).
"""

from __future__ import annotations

import collections
import hashlib
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpt2.config import is_integer

BLOCK_TOKENS = 16  # tokens per block (vLLM's default): the unit of storage and eviction
KEY_BYTES = 16  # the hash chain's digest size (128 bits)


@dataclass(slots=True)
class _Block:
    slot: int  # its place in the pool
    k: torch.Tensor  # (n_layer, nh, tokens, hs), a view of the slot: B tokens, or fewer in a prompt's last block
    v: torch.Tensor
    tokens: tuple[int, ...]  # the block's own tokens
    parent: bytes  # the key of the block before it (the namespace for a first block)
    evicted: bool = False  # its slot is free, or holds another block now


@dataclass(frozen=True)
class CachedPrefix:
    """The cached blocks a prompt starts with (maybe none), of which it reuses the first `length` tokens (all of
    every block but maybe the last)."""

    blocks: tuple[_Block, ...] = ()
    length: int = 0

    def copy_into(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K and V of the first `tokens` (<= length) tokens into k and v, each (n_layer, nh, tokens, hs),
        block by block: no concatenated copy in between (at 700 tokens of the 124M model one costs ~10 ms)."""
        tokens = k.shape[2]
        assert 0 < tokens <= self.length, f"{tokens} tokens asked of a cached prefix of {self.length}"
        start = 0
        for block in self.blocks:
            assert not block.evicted, "a cached prefix is copied before the next insert, which may reuse its blocks"
            end = min(start + len(block.tokens), tokens)
            k[:, :, start:end] = block.k[:, :, : end - start]
            v[:, :, start:end] = block.v[:, :, : end - start]
            start = end
            if start == tokens:
                return


class PrefixCache:
    """K/V blocks of earlier prompts under a byte budget, least recently used evicted first (module docstring).

    >>> cache = PrefixCache(max_bytes=1 << 20)
    >>> k = v = torch.zeros(2, 2, 40, 16)  # (n_layer, nh, T, hs): a prompt of 40 tokens
    >>> cache.insert(list(range(40)), k, v)  # 2 whole blocks and 8 tokens
    >>> cache.lookup([*range(40), 7]).length  # a prompt that starts with them
    40
    >>> cache.lookup([*range(20), 7]).length  # the first 4 tokens of the second block agree
    20
    """

    def __init__(self, max_bytes: int, *, block_tokens: int = BLOCK_TOKENS) -> None:
        for name, value in (("max_bytes", max_bytes), ("block_tokens", block_tokens)):
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._pool: tuple[torch.Tensor, torch.Tensor] | None = None  # K and V, (capacity, n_layer, nh, B, hs) each
        self._free: list[int] = []  # free slots of the pool
        self._blocks: collections.OrderedDict[bytes, _Block] = collections.OrderedDict()  # least recent first
        # a key -> the keys of the blocks stored after it (a dict: ordered, so a lookup's choice is reproducible)
        self._children: dict[bytes, dict[bytes, None]] = {}
        self.queries = 0
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    @property
    def capacity(self) -> int:
        """Blocks the pool holds (0 until it is reserved)."""
        return 0 if self._pool is None else self._pool[0].shape[0]

    @property
    def block_bytes(self) -> int:
        """Keys and values of one block (0 until the pool is reserved)."""
        return 0 if self._pool is None else 2 * self._pool[0][0].nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks held (a partial block counts whole: it takes a block of the pool)."""
        return len(self._blocks) * self.block_bytes

    def lookup(self, tokens: Sequence[int], namespace: bytes = b"") -> CachedPrefix:
        """The longest cached prefix of `tokens` in `namespace`: whole blocks down the chain, then the first tokens
        of a block stored under the last one found, as many as agree (module docstring). Its blocks become the most
        recent."""
        B = self.block_tokens
        found: list[bytes] = []
        length, parent = 0, namespace
        for key in self._keys(tokens, len(tokens) // B, namespace):
            if key not in self._blocks:
                break
            found.append(key)
            length, parent = length + B, key
        rest = tuple(tokens[length : length + B])  # what the next block would hold: fewer than B, or a miss
        best, agreed = None, 0
        for key in self._children.get(parent, ()):
            same = _common_length(self._blocks[key].tokens, rest)
            if same > agreed:
                best, agreed = key, same
        if best is not None:
            found.append(best)
            length += agreed
        self._use(found)
        return CachedPrefix(tuple(self._blocks[key] for key in found), length)

    def reserve(
        self, n_layer: int, n_head: int, head_size: int, *, dtype: torch.dtype, device: torch.device | None = None
    ) -> None:
        """Allocate the pool for keys and values of this shape, zero-filled (module docstring); nothing to do when
        it is there. A ValueError for another shape: one cache holds one model's keys and values."""
        shape = (n_layer, n_head, self.block_tokens, head_size)
        if self._pool is not None:
            k_pool = self._pool[0]
            if k_pool.shape[1:] != shape or k_pool.dtype != dtype or (device is not None and k_pool.device != device):
                raise ValueError(
                    f"this prefix cache holds keys and values of {tuple(k_pool.shape[1:])} {k_pool.dtype} blocks, "
                    f"not {shape} {dtype}; give each model a cache of its own"
                )
            return
        capacity = self.max_bytes // (2 * math.prod(shape) * dtype.itemsize)
        self._pool = (
            torch.zeros((capacity, *shape), dtype=dtype, device=device),
            torch.zeros((capacity, *shape), dtype=dtype, device=device),
        )
        self._free = list(reversed(range(capacity)))

    def insert(self, tokens: Sequence[int], k: torch.Tensor, v: torch.Tensor, namespace: bytes = b"") -> None:
        """Keep the blocks of a prefilled prompt, its last partial one too: `tokens` (T) and their K, V
        (n_layer, nh, T, hs), copied into the pool, under `namespace`. Blocks already held are only used; a prompt
        with more blocks than the pool keeps its first ones."""
        T, B = len(tokens), self.block_tokens
        assert k.shape == v.shape and k.shape[2] == T, f"K/V {tuple(k.shape)} do not match {T} tokens"
        self.reserve(k.shape[0], k.shape[1], k.shape[3], dtype=k.dtype, device=k.device)
        assert self._pool is not None
        k_pool, v_pool = self._pool
        keys: list[bytes] = []
        parent = namespace
        for start in range(0, T, B):
            if len(keys) == self.capacity:
                break  # the prompt's blocks so far fill the pool; the most recent, they are never evicted here
            block_tokens = tuple(tokens[start : start + B])
            key = self._key(parent, block_tokens)
            if key not in self._blocks:
                if not self._free:
                    self._evict()
                slot, n = self._free.pop(), len(block_tokens)
                block = _Block(slot, k_pool[slot, :, :, :n], v_pool[slot, :, :, :n], block_tokens, parent)
                block.k.copy_(k[:, :, start : start + n])
                block.v.copy_(v[:, :, start : start + n])
                self._blocks[key] = block
                self._children.setdefault(parent, {})[key] = None
            else:
                self._blocks.move_to_end(key)
            keys.append(key)
            parent = key
        self._use(keys)

    def record(self, queried: int, reused: int) -> None:
        """Count a prompt's lookup: `queried` tokens looked up, `reused` of them not prefilled."""
        assert 0 <= reused <= queried
        self.queries += queried
        self.hits += reused

    def _keys(self, tokens: Sequence[int], count: int, namespace: bytes) -> list[bytes]:
        """The hash-chain keys of the first `count` whole blocks of `tokens` in `namespace`."""
        keys, key = [], namespace
        for i in range(count):
            key = self._key(key, tokens[i * self.block_tokens : (i + 1) * self.block_tokens])
            keys.append(key)
        return keys

    @staticmethod
    def _key(parent: bytes, tokens: Sequence[int]) -> bytes:
        return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=KEY_BYTES).digest()

    def _evict(self) -> None:
        """Drop the least recently used block."""
        key, block = self._blocks.popitem(last=False)
        siblings = self._children[block.parent]
        del siblings[key]
        if not siblings:
            del self._children[block.parent]
        block.evicted = True
        self._free.append(block.slot)
        self.evictions += 1

    def _use(self, keys: list[bytes]) -> None:
        """Mark a prompt's blocks most recent, its first block last (so its tail is evicted before its head)."""
        for key in reversed(keys):
            self._blocks.move_to_end(key)


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens a and b share."""
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same
