"""Sliding-window perplexity throughput, ours (gpt2.eval.perplexity) vs transformers' GPT2LMHeadModel.

Both models hold the same random weights (ours saved, then loaded by transformers), see the same windows
(`sliding_windows`) in the same batches, and score the same targets; rounds alternate ours / theirs so machine
noise hits both, and the median of each is reported with the ratio. The two losses are printed too: they must
agree (fast path = reference path). Throughput counts scored tokens per second.

    python benchmarks/bench_evaluate.py                     # 124M shape, 3 windows of 1024 in one batch, CPU
    python benchmarks/bench_evaluate.py --device cuda --tokens 16385 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

from gpt2 import GPT, GPTConfig
from gpt2.eval import perplexity, sliding_windows
from gpt2.model import IGNORE_INDEX
from gpt2.weights import save_pretrained


def hf_perplexity(model, tokens: np.ndarray, context_length: int, stride: int, batch_size: int) -> float:
    """The same windows and batches through transformers' model: mean loss of the scored tokens."""
    windows = sliding_windows(len(tokens), context_length, stride)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for first in range(0, len(windows), batch_size):
            batch = windows[first : first + batch_size]
            rows = torch.from_numpy(np.stack([tokens[w.start : w.end + 1] for w in batch]).astype(np.int64)).to(device)
            idx, targets = rows[:, :-1], rows[:, 1:].clone()
            for row, window in enumerate(batch):
                targets[row, : window.first_scored] = IGNORE_INDEX
            logits = model(input_ids=idx).logits
            total += float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum"))
            count += int((targets != IGNORE_INDEX).sum())
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=1537, help="length of the random token stream")
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per implementation (after 1 warm-up)")
    args = parser.parse_args()

    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    device = torch.device(args.device)
    ours = GPT(GPTConfig.from_name(args.preset)).to(device).eval()
    with tempfile.TemporaryDirectory() as directory:
        save_pretrained(ours, directory)
        theirs = GPT2LMHeadModel.from_pretrained(directory).to(device).eval()
    context = ours.config.block_size
    tokens = np.random.default_rng(0).integers(0, ours.config.vocab_size, size=args.tokens)
    scored = args.tokens - 1

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def run_ours() -> float:
        return perplexity(ours, tokens, context_length=context, stride=args.stride, batch_size=args.batch_size).loss

    def run_theirs() -> float:
        return hf_perplexity(theirs, tokens, context, args.stride, args.batch_size)

    times: dict[str, list[float]] = {"ours": [], "transformers": []}
    losses: dict[str, float] = {}
    for round_number in range(args.rounds + 1):  # round 0 warms up both
        for name, run in (("ours", run_ours), ("transformers", run_theirs)):
            sync()
            start = time.perf_counter()
            losses[name] = run()
            sync()
            if round_number:
                times[name].append(time.perf_counter() - start)

    result = {
        "preset": args.preset,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "windows": len(sliding_windows(args.tokens, context, args.stride)),
        "context_length": context,
        "stride": args.stride,
        "batch_size": args.batch_size,
        "scored_tokens": scored,
        "rounds": args.rounds,
    }
    for name, seconds in times.items():
        median = statistics.median(seconds)
        result[f"{name}_s"] = round(median, 3)
        result[f"{name}_tokens_per_s"] = round(scored / median, 1)
        result[f"{name}_loss"] = losses[name]
    result["ratio_ours_over_transformers"] = round(result["ours_tokens_per_s"] / result["transformers_tokens_per_s"], 3)
    result["loss_abs_diff"] = abs(losses["ours"] - losses["transformers"])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
