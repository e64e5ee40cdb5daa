"""`BatchLoader`: (x, y) next-token batches from a token stream (a `TokenView` over memory-mapped shards, or any
1-D array), shuffled (nanoGPT) or in order (llm.c), split over distributed ranks, resumable from a small state
dict."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gpt2.config import is_integer
from gpt2.data.view import TokenView


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed for (seed, step), well mixed so neighbouring steps are unrelated.

    Each step gets its own seed, so a loader's whole state is its step number and resuming is O(1).
    """
    words = np.random.SeedSequence([seed, step]).generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


class BatchLoader:
    """Batches of (x, y) next-token pairs, shape (batch_size, block_size), y = x shifted left by one.

    shuffle=True (nanoGPT): every step draws batch_size * world_size random start offsets from a
    torch.Generator seeded by (seed, step). shuffle=False (llm.c): the stream is cut into consecutive windows of
    block_size tokens (the last window needs one more token for its target) and read in order, wrapping around
    to the start after the last whole window.

    The stream may be a `TokenView` (`load_split`): only the rows of the current batch are read, so memory does
    not depend on the corpus size. Windows may cross shard boundaries: the shards are consecutive pieces of one
    stream, so the batches are exactly those of the concatenated array.

    Distributed: every rank computes the same global batch of batch_size * world_size rows and keeps rows
    rank * batch_size ... (rank + 1) * batch_size - 1, so the union over ranks equals what one process with
    batch_size * world_size gets; a 2-process run sees the same data as a 1-process run with the same global
    batch. The ranks' rows are disjoint parts of that batch: in order (shuffle=False), no window is read by two
    ranks before the stream wraps around; shuffled, each rank's rows are its own draws (two draws may overlap by
    chance, as in one process). For the same reason a state_dict may be loaded under another world size with
    the same global batch.

    >>> loader = BatchLoader(np.arange(100, dtype=np.uint16), batch_size=2, block_size=8)
    >>> x, y = loader.next_batch()
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
    (torch.Size([2, 8]), True)
    """

    def __init__(
        self,
        tokens: TokenView | np.ndarray,
        batch_size: int,
        block_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("block_size", block_size), ("world_size", world_size)):
            if not is_integer(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D array, got shape {tuple(tokens.shape)}")
        if len(tokens) < block_size + 1:
            raise ValueError(
                f"the split has {len(tokens)} tokens; need at least block_size+1 = {block_size + 1}; "
                "use a smaller block size or more data"
            )
        self.tokens = tokens
        self._view = tokens if isinstance(tokens, TokenView) else TokenView([np.asarray(tokens)], dtype=tokens.dtype)
        self.batch_size = batch_size
        self.block_size = block_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.step = 0
        # sequential mode reads windows [k*T, k*T + T] (T+1 tokens with the target), k < num_windows
        self.num_windows = (len(tokens) - 1) // block_size

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def _offsets(self, step: int) -> np.ndarray:
        """Start offsets of this rank's rows at `step`, shape (batch_size,)."""
        B, T = self.batch_size, self.block_size
        if self.shuffle:
            generator = torch.Generator().manual_seed(_step_seed(self.seed, step))
            # the largest start is len - T - 1, so the target of the last position exists
            offsets = torch.randint(len(self.tokens) - T, (self.global_batch_size,), generator=generator).numpy()
        else:
            first_row = step * self.global_batch_size
            rows = np.arange(first_row, first_row + self.global_batch_size, dtype=np.int64)
            offsets = (rows % self.num_windows) * T
        return offsets[self.rank * B : (self.rank + 1) * B]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y), both int64 of shape (batch_size, block_size), on the CPU."""
        rows = self._view.rows(self._offsets(self.step), self.block_size + 1)  # (B, T+1) int64
        self.step += 1
        batch = torch.from_numpy(rows)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and bools (JSON-safe): the step to continue from and what must match on resume."""
        return {
            "step": self.step,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "global_batch_size": self.global_batch_size,
            "block_size": self.block_size,
            "num_tokens": len(self.tokens),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the loader that produced `state` stopped (same data, seed and global batch)."""
        expected = self.state_dict()
        for key in ("seed", "shuffle", "global_batch_size", "block_size", "num_tokens"):
            if state.get(key) != expected[key]:
                raise ValueError(
                    f"cannot resume the batch loader: the saved state has {key}={state.get(key)!r} but this loader "
                    f"has {key}={expected[key]!r}; resume with the same data, seed, shuffle, block size and "
                    "global batch size (batch_size * world_size)"
                )
        step = state.get("step")
        if not is_integer(step) or step < 0:
            raise ValueError(f"the saved batch loader state has step={step!r}; expected a non-negative integer")
        self.step = step
