"""How `gpt2 bench` times things: each call between two device synchronizations (`timed`), and the one loop every
area measures with (`interleaved`).

The machines these figures come from are shared and noisy, so ours and its peers are never measured one after the
other: every repetition runs each of them once, and the odd repetitions run them in reverse order. A change in load
from other processes then falls on all of them alike, and none always runs first or right after the same other one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function: Callable[[], object], device: torch.device | None = None) -> float:
    """Seconds `function` takes, the device synchronized before and after."""
    device = device or torch.device("cpu")
    synchronize(device)
    start = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - start


def interleaved(functions: Mapping[str, Callable[[], T]], *, warmup: int, repetitions: int) -> dict[str, list[T]]:
    """Each function's results by its engine's name: `warmup` untimed rounds (allocator, oneDNN's kernels,
    compilation), then `repetitions` rounds that keep what each call returns. A round calls every function once, in
    the mapping's order, reversed in odd rounds (module docstring). Each function measures itself (a rate, seconds,
    a dict of figures): only it knows which part of its work counts.

        interleaved({"ours": ours, "transformers": theirs}, warmup=1, repetitions=3)
        # calls ours, theirs (warm-up); ours, theirs; theirs, ours; ours, theirs
        # -> {"ours": [3 results], "transformers": [3 results]}
    """
    for _ in range(warmup):
        for function in functions.values():
            function()
    names = list(functions)
    results: dict[str, list[T]] = {name: [] for name in names}
    for repetition in range(repetitions):
        for name in names if repetition % 2 == 0 else reversed(names):
            results[name].append(functions[name]())
    return results
