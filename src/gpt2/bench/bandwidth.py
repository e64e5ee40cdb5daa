"""How close decoding runs to the memory's speed: the bytes of weights one decode step reads, and the rate this
machine reads a large buffer at.

A decode step at batch 1 reads every weight once and does little arithmetic per byte, so its speed is set by how
fast the weights stream from memory. Bytes per step x steps per second is the bandwidth the step reached; a
read-only pass over a buffer far larger than the caches (`read_pass`), with the same threads, is about the most
the step could reach on this machine, so their ratio says how much is left.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpt2.bench.timing import timed
from gpt2.model import GPT

GB = 1e9
READ_BUFFER_BYTES = 512 * 2**20  # far beyond any CPU's last-level cache, as the 124M model's weights are
READ_PASSES = 5  # timed passes over the buffer, of which the fastest counts


def decode_step_bytes(model: GPT) -> int:
    """Bytes of the weights one decode step reads from `model` as prepared for inference (`prepare_for_inference`):
    every tensor each block's linear layers and LayerNorms store, the final LayerNorm's and the LM head's, each in
    its layout (a `NativeLinear`'s packed weight and scales, an nn.Linear's weight, biases included). oneDNN's
    packed copy of a float32 weight is no buffer and is not counted: the native decoder reads the plain weight. The
    token and position embeddings give one row each per step, not their tables, and are left out.
    """
    transformer = model.transformer
    parts = [*transformer.h, transformer.ln_f, model.lm_head]
    return sum(tensor.nbytes for part in parts for tensor in (*part.parameters(), *part.buffers()))


def read_pass(
    device: torch.device, size_bytes: int = READ_BUFFER_BYTES, passes: int = READ_PASSES
) -> Callable[[], float]:
    """A function giving the GB/s of the fastest of `passes` read-only passes (`torch.sum`) over a float32 buffer
    of `size_bytes` on `device`, with torch's threads (those `gpt2 bench --threads` sets): what memory delivers at
    that moment. The buffer is made and written once, here, so its pages exist before any pass is timed; `gpt2
    bench decode` calls it in every round of its repetitions, beside the decode steps, so both see the same load
    of a noisy machine."""
    buffer = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    return lambda: max(buffer.nbytes / timed(lambda: buffer.sum(), device) / GB for _ in range(passes))
