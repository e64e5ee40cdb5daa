"""Experiment tracking's cost per training step: the Trainer at the stdlib preset (4 layers, 128 wide, 128
tokens x 16 sequences, on random tokens) with log_to = none / tensorboard / wandb (offline), the modes
alternating in rounds so a change of machine load hits every mode alike. Each step logs its metrics line (the
stdlib preset's log_interval=1), so every step pays the tracker's call. The figure is the median wall time of
a step (train_step: forward, backward, clip, AdamW, the metrics line and the trackers), per mode; the goal is
< 2% over none.

    flock /tmp/bench.lock python benchmarks/bench_tracking.py --rounds 5 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gpt2.data import BatchLoader
from gpt2.model import GPT
from gpt2.train import TrainConfig, Trainer, configure_optimizer
from gpt2.train.tracking import Tracking

MODES: dict[str, tuple[str, ...]] = {"none": (), "tensorboard": ("tensorboard",), "wandb": ("wandb",)}


def step_times(mode: str, steps: int, out: Path) -> list[float]:
    config = TrainConfig.from_name("stdlib", device="cpu", dtype="float32", out_dir=str(out / mode),
                                   log_to=MODES[mode], eval_interval=0)  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config.model_config(vocab_size=4096))
    tokens = torch.randint(0, 4096, (200_000,), dtype=torch.int32).numpy()
    batches = BatchLoader(tokens, config.batch_size, config.block_size or 128, seed=0)
    with Tracking(config) as tracking:
        trainer = Trainer(model, configure_optimizer(model, config, torch.device("cpu")), config, batches,
                          callbacks=[tracking])  # fmt: skip
        trainer.train_step()  # warm-up: one-off costs
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            trainer.train_step()
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode per round")
    args = parser.parse_args()
    torch.set_num_threads(2)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                times[mode] += step_times(mode, args.steps, Path(tmp) / f"round{round_}")
    base = statistics.median(times["none"])
    print("| log_to | median ms/step | vs none | steps |")
    print("|---|---|---|---|")
    for mode, values in times.items():
        median = statistics.median(values)
        print(f"| {mode} | {1000 * median:.1f} | {100 * (median / base - 1):+.2f}% | {len(values)} |")


if __name__ == "__main__":
    main()
