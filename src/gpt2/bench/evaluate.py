"""Sliding-window perplexity throughput: `gpt2.eval.perplexity` against transformers' GPT2LMHeadModel (opt-in)
on the same weights, windows, batches and targets. The two losses must agree (fast path = reference path): a
disagreement is an error, not a figure.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpt2.bench.record import Recorder
from gpt2.bench.setup import SEED, BenchSettings, bench_model
from gpt2.bench.timing import interleaved, timed
from gpt2.eval import perplexity, sliding_windows
from gpt2.model import GPT, IGNORE_INDEX

LOSS_TOLERANCE = 1e-3  # nats: float32 sums in a different order
OURS, TRANSFORMERS = "ours", "transformers"  # the engines' names; the peer's is its records' peer


@dataclass(frozen=True)
class EvalWork:
    tokens: int = 1537
    """Length of the random token stream scored."""
    stride: int = 256
    batch_size: int = 3
    peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if any(peer != "transformers" for peer in self.peers):
            raise ValueError(f"eval peers: transformers only, got {', '.join(self.peers)}")
        if self.tokens < 2 or self.stride < 1 or self.batch_size < 1:
            raise ValueError("--tokens must be at least 2, --stride and --batch-size at least 1")

    def check_context(self, context: int) -> None:
        """The windows need a stride within the model's context."""
        if self.stride > context:
            raise ValueError(f"--stride {self.stride} is longer than the model's context of {context} tokens; "
                             f"pass --stride {context} or less")  # fmt: skip


@torch.no_grad()
def transformers_loss(theirs: Any, tokens: np.ndarray, context: int, work: EvalWork) -> float:
    """The same windows and batches through transformers' model: mean loss of the scored tokens."""
    windows = sliding_windows(len(tokens), context, work.stride)
    device = next(theirs.parameters()).device
    total, count = 0.0, 0
    for first in range(0, len(windows), work.batch_size):
        batch = windows[first : first + work.batch_size]
        rows = torch.from_numpy(np.stack([tokens[w.start : w.end + 1] for w in batch]).astype(np.int64)).to(device)
        idx, targets = rows[:, :-1], rows[:, 1:].clone()
        for row, window in enumerate(batch):
            targets[row, : window.first_scored] = IGNORE_INDEX
        logits = theirs(input_ids=idx).logits
        total += float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum"))
        count += int((targets != IGNORE_INDEX).sum())
    return total / count


def run_eval(settings: BenchSettings, work: EvalWork, recorder: Recorder) -> None:
    """`gpt2 bench eval`: scored tokens/s of the sliding-window perplexity, ours and transformers alternating."""
    device = settings.torch_device
    ours: GPT = bench_model(settings).to(device)
    context = ours.config.block_size
    work.check_context(context)
    tokens = np.random.default_rng(SEED).integers(0, ours.config.vocab_size, size=work.tokens)
    losses: dict[str, float] = {}

    def run_ours() -> None:
        losses[OURS] = perplexity(ours, tokens, context_length=context, stride=work.stride,
                                  batch_size=work.batch_size).loss  # fmt: skip

    scored = work.tokens - 1
    engines: dict[str, Callable[[], float]] = {OURS: lambda: scored / timed(run_ours, device)}
    if "transformers" in work.peers:
        from transformers import GPT2LMHeadModel

        from gpt2.weights import save_pretrained

        with tempfile.TemporaryDirectory() as folder:
            save_pretrained(ours, folder)
            theirs = GPT2LMHeadModel.from_pretrained(folder).eval()
        theirs.to(device)

        def run_theirs() -> None:
            losses[TRANSFORMERS] = transformers_loss(theirs, tokens, context, work)

        engines[TRANSFORMERS] = lambda: scored / timed(run_theirs, device)
    rates = interleaved(engines, warmup=settings.warmup, repetitions=settings.repetitions)
    if TRANSFORMERS in losses and abs(losses[OURS] - losses[TRANSFORMERS]) > LOSS_TOLERANCE:
        raise RuntimeError(f"losses disagree: ours {losses[OURS]:.5f}, transformers {losses[TRANSFORMERS]:.5f}")
    params = {"tokens": work.tokens, "context": context, "stride": work.stride, "batch": work.batch_size,
              "device": device.type, **settings.model_params()}  # fmt: skip
    peer = (TRANSFORMERS, rates[TRANSFORMERS]) if TRANSFORMERS in rates else None
    recorder.add("eval", "perplexity tokens/s", params, rates[OURS], "tokens/s", peer)
