"""Per-step cost of Muon against AdamW: the optimizer step alone and the whole training step, interleaved.

For each shape: forward + backward on one micro-batch (timed once per repeat, shared by both), then the
optimizer step of AdamW (fused, every parameter) and of MuonAdamW (Muon on the blocks' matrices, fused AdamW on
the rest), alternating. A training step is forward + backward over grad_accum micro-batches plus one optimizer
step, so the ratio (fwd_bwd * micro_batches + muon) / (fwd_bwd * micro_batches + adamw) is given at the measured
batch and, for the 124M shape, at the gpt2-124m preset's 524,288 tokens per step (micro-batches derived from the
measured per-token cost: an extrapolation, labelled so).

    flock /tmp/bench.lock python benchmarks/bench_optim_step.py                 # both shapes
    flock /tmp/bench.lock python benchmarks/bench_optim_step.py --shape small --compile
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.train.config import TrainConfig
from gpt2.train.optimizer import configure_optimizer

SHAPES = {
    # the shakespeare-char recipe: 4 layers, width 128, block 64, batch 12, byte vocabulary
    "small": (GPTConfig(vocab_size=257, block_size=64, n_layer=4, n_head=4, n_embd=128), 12, 64, None),
    # GPT-2 124M at batch 4 x 256 on this CPU; the preset's step is 524,288 tokens
    "124m": (GPTConfig(vocab_size=50257, block_size=1024), 4, 256, 524_288),
}
CPU = torch.device("cpu")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), action="append")
    parser.add_argument("--repeats", type=int, default=None, help="default: 20 small, 3 for 124m")
    parser.add_argument("--compile", action="store_true", help="also time muon_compile=True")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for shape in args.shape or list(SHAPES):
        config, batch, seq, preset_tokens = SHAPES[shape]
        torch.manual_seed(0)
        model = GPT(config).train()
        x = torch.randint(0, config.vocab_size, (batch, seq + 1))
        variants = {"adamw": TrainConfig(), "muon": TrainConfig.from_dict(dict(optimizer="muon"))}
        if args.compile:
            variants["muon+compile"] = TrainConfig.from_dict(dict(optimizer="muon", muon_compile=True))
        optimizers = {name: configure_optimizer(model, settings.optimizer, CPU) for name, settings in variants.items()}
        start = {k: v.clone() for k, v in model.state_dict().items()}
        times: dict[str, list[float]] = {"fwd_bwd": [], **{name: [] for name in optimizers}}
        repeats = args.repeats or (20 if shape == "small" else 3)
        for repeat in range(repeats + 1):  # the first round warms up (and compiles)
            for name, optimizer in optimizers.items():
                model.load_state_dict(start)  # every optimizer steps from the same weights and gradients
                optimizer.zero_grad(set_to_none=True)
                started = time.perf_counter()
                model(x[:, :-1], x[:, 1:]).loss.backward()
                seconds = time.perf_counter() - started
                if repeat:
                    times["fwd_bwd"].append(seconds)
                    times[name].append(timed(optimizer.step))
                else:
                    optimizer.step()
        ms = {name: 1000 * statistics.median(values) for name, values in times.items()}
        tokens = batch * seq
        row: dict = {"shape": shape, "tokens_per_micro_batch": tokens, "threads": torch.get_num_threads(),
                     **{f"{name}_ms": round(value, 1) for name, value in ms.items()}}  # fmt: skip
        for name in optimizers:
            if name != "adamw":
                row[f"{name}/adamw step, measured batch"] = round(
                    (ms["fwd_bwd"] + ms[name]) / (ms["fwd_bwd"] + ms["adamw"]), 3
                )
                if preset_tokens:
                    fwd_bwd = ms["fwd_bwd"] * preset_tokens / tokens  # extrapolated from the measured tokens
                    row[f"{name}/adamw step at {preset_tokens} tokens (extrapolated)"] = round(
                        (fwd_bwd + ms[name]) / (fwd_bwd + ms["adamw"]), 4
                    )
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
