"""`TokenView`: one split's token stream over its shard files, each memory-mapped, nothing loaded.

A split of a prepared folder (see `gpt2.data.shards`) is one stream cut into shard files at fixed token counts,
not at document boundaries, so a document may continue in the next shard. The view reads it as that one stream:
`view[i:j]` is exactly `np.concatenate(shards)[i:j]`, and a window that crosses a shard boundary is read from
both shards. Reading a window touches only its own pages, so memory does not grow with the corpus; the pages
the kernel keeps cached are file-backed and given back under memory pressure.

    >>> view = TokenView([np.arange(5, dtype=np.uint16), np.arange(5, 8, dtype=np.uint16)])
    >>> len(view), view[3:7].tolist()
    (8, [3, 4, 5, 6])
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np


class TokenView:
    """A read-only 1-D sequence of token ids made of consecutive 1-D arrays (memory-mapped shards).

    Indexing follows numpy: an integer gives one id (a numpy integer), a slice gives an ndarray (a zero-copy view
    when it lies inside one shard, a copy when it spans several). `np.asarray(view)` loads the whole split into
    memory: fine for a small split or a test, not for a corpus.
    """

    def __init__(self, shards: Sequence[np.ndarray], dtype: np.dtype | None = None) -> None:
        arrays = [shard for shard in shards if len(shard) > 0]  # an empty shard would own no position
        for array in arrays:
            if array.ndim != 1:
                raise ValueError(f"every shard must be a 1-D array, got shape {tuple(array.shape)}")
        dtypes = {array.dtype for array in arrays}
        if len(dtypes) > 1:
            raise ValueError(f"shards must share one dtype, got {', '.join(sorted(map(str, dtypes)))}")
        if dtype is None:
            if not arrays:
                raise ValueError("a view of no tokens needs its dtype: pass dtype=")
            dtype = arrays[0].dtype
        elif arrays and arrays[0].dtype != np.dtype(dtype):
            raise ValueError(f"the shards hold {arrays[0].dtype}, not the dtype {np.dtype(dtype)} passed")
        self.shards: tuple[np.ndarray, ...] = tuple(arrays)
        self._mappings = [_mapping_of(array) for array in arrays]  # None for an array in memory
        self.dtype = np.dtype(dtype)
        # shard k holds positions starts[k] ... starts[k + 1] - 1; (num_shards + 1,) int64
        self.starts = np.concatenate([[0], np.cumsum([len(a) for a in arrays], dtype=np.int64)]).astype(np.int64)

    # ------------------------------------------------------------------------------- ndarray-like surface
    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def size(self) -> int:
        return len(self)

    def __getitem__(self, key: int | np.integer | slice) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return self.read(start, max(start, stop))
            return self.take(np.arange(start, stop, step, dtype=np.int64))
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            index = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= index < len(self):
                raise IndexError(f"index {int(key)} is out of range for a view of {len(self)} tokens")
            shard = self._shard_of(index)
            return self.shards[shard][index - self.starts[shard]]
        raise TypeError(f"a TokenView is indexed by an integer or a slice, got {type(key).__name__}")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The whole stream in memory (numpy's conversion protocol: np.asarray, np.concatenate, ...)."""
        if copy is False and len(self.shards) > 1:
            raise ValueError("a view of several shards cannot become one array without a copy")
        array = self.read(0, len(self))
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return np.array(array) if copy else array

    def tolist(self) -> list[int]:
        return self.read(0, len(self)).tolist()

    def __repr__(self) -> str:
        return f"TokenView({len(self):,} {self.dtype} tokens in {len(self.shards)} shard(s))"

    # ------------------------------------------------------------------------------------------ reading
    def _shard_of(self, position: int) -> int:
        return int(np.searchsorted(self.starts, position, side="right")) - 1

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens start ... stop - 1 (0 <= start <= stop <= len): a view inside one shard, else one copy."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"range [{start}, {stop}) is outside a view of {len(self)} tokens")
        if start == stop:
            return np.zeros(0, dtype=self.dtype)
        shard = self._shard_of(start)
        parts = []
        while start < stop:
            begin = start - int(self.starts[shard])
            end = min(stop, int(self.starts[shard + 1])) - int(self.starts[shard])
            parts.append(np.asarray(self.shards[shard][begin:end]))
            start += end - begin
            shard += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def rows(self, starts: np.ndarray | Sequence[int], length: int) -> np.ndarray:
        """Windows view[s : s + length] for each s in `starts`, stacked: shape (len(starts), length), int64.

        A window may cross shard boundaries; it must end inside the view. The rows are copies: the pages read for
        them are given back to the page cache afterwards (see the module docstring).
        """
        starts = np.asarray(starts, dtype=np.int64)
        rows = np.stack([self.read(int(s), int(s) + length) for s in starts]).astype(np.int64)
        if len(starts):
            touched = np.searchsorted(self.starts, np.concatenate([starts, starts + length - 1]), side="right") - 1
            self.release(np.unique(touched).tolist())
        return rows

    def release(self, shards: Sequence[int] | None = None) -> None:
        """Unmap the pages of `shards` (default: all) from this process; the next read maps them again from the
        page cache. Arrays returned earlier stay valid (read-only file mappings are re-read on access)."""
        for index in range(len(self.shards)) if shards is None else shards:
            mapping = self._mappings[index]
            if mapping is not None and hasattr(mapping, "madvise"):  # madvise: POSIX only
                mapping.madvise(mmap.MADV_DONTNEED)

    def take(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        """The ids at arbitrary `positions` (each in [0, len)), in that order."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"positions must be in [0, {len(self)})")
        out = np.empty(positions.shape, dtype=self.dtype)
        shard_of = np.searchsorted(self.starts, positions, side="right") - 1
        for shard in np.unique(shard_of):
            chosen = shard_of == shard
            out[chosen] = self.shards[shard][positions[chosen] - self.starts[shard]]
        return out


def _mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The memory map an array reads from (np.memmap, np.load(mmap_mode=...), np.frombuffer(mmap)), else None."""
    base: object = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base
