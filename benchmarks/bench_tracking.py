"""Experiment tracking's cost per training step: the Trainer at the stdlib preset (4 layers, 128 wide, 128
tokens x 16 sequences, on random tokens) with log_to = none / tensorboard / wandb (offline), the modes
alternating in rounds so a change of machine load hits every mode alike. Each step logs its metrics line (the
stdlib preset's log_interval=1), so every step pays the tracker's call. The figure is the median wall time of
a step (train_step: forward, backward, clip, AdamW, the metrics line and the trackers), per mode; the goal is
< 2% over none. Wall time on a 2-core machine shared with other work moves by several percent from minute to
minute, more than the trackers cost, so the benchmark also measures the trackers' cost directly, per step:
- in the trackers' calls: the time the training thread spends in `Tracking.on_metrics` (the only synchronous
  cost: the metrics line is handed to each tracker there);
- the trackers' own CPU: CPU seconds of the threads the trackers started in this process (TensorBoard's event
  writer, wandb's senders) and of child processes (wandb's `wandb-core` service), read with psutil around each
  step. On a machine whose cores the training threads already use, this CPU is taken from training.
Their sum over the step time of `none` is the overhead figure.

    flock /tmp/bench.lock python benchmarks/bench_tracking.py --rounds 5 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from gpt2.data import BatchLoader
from gpt2.model import GPT
from gpt2.train import LoopOptions, TrainConfig, Trainer, TrainingData, configure_optimizer
from gpt2.train.tracking import Tracking

MODES: dict[str, tuple[str, ...]] = {"none": (), "tensorboard": ("tensorboard",), "wandb": ("wandb",)}


def cpu_seconds(process: psutil.Process, known_threads: set[int]) -> float:
    """CPU seconds used so far by this process's threads not in `known_threads` and by its live descendants."""
    total = sum(thread.user_time + thread.system_time for thread in process.threads() if thread.id not in known_threads)
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:  # ended between the listing and the reading
            pass
    return total


class TimedTracking(Tracking):
    """Tracking that adds up the time the training thread spends handing metrics to the trackers."""

    seconds = 0.0

    def on_metrics(self, trainer: Trainer, record: dict[str, Any]) -> None:
        started = time.perf_counter()
        super().on_metrics(trainer, record)
        self.seconds += time.perf_counter() - started


def step_costs(mode: str, steps: int, out: Path) -> dict[str, list[float]]:
    """Per step of `steps` training steps with the trackers of `mode`: wall seconds, seconds in the trackers'
    calls and the trackers' own CPU seconds (module docstring)."""
    config = TrainConfig.from_name("stdlib", device="cpu", dtype="float32", out_dir=str(out / mode),
                                   log_to=MODES[mode], eval_interval=0)  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config.model_config(vocab_size=4096))
    tokens = torch.randint(0, 4096, (200_000,), dtype=torch.int32).numpy()
    batches = BatchLoader(tokens, config.data.batch_size, config.model.block_size or 128, seed=0)
    process = psutil.Process()
    trainer_threads = {thread.id for thread in process.threads()}  # the training's own (main and intra-op)
    costs: dict[str, list[float]] = {"wall": [], "calls": [], "cpu": []}
    with TimedTracking(config) as tracking:
        trainer = Trainer(model, configure_optimizer(model, config.optimizer, torch.device("cpu")), config,
                          TrainingData(batches), loop=LoopOptions(callbacks=[tracking]))  # fmt: skip
        trainer.train_step()  # warm-up: one-off costs
        for _ in range(steps):
            cpu, calls, started = cpu_seconds(process, trainer_threads), tracking.seconds, time.perf_counter()
            trainer.train_step()
            costs["wall"].append(time.perf_counter() - started)
            costs["calls"].append(tracking.seconds - calls)
            costs["cpu"].append(cpu_seconds(process, trainer_threads) - cpu)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode per round")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.randn(1 << 22).exp_().sum()  # start torch's intra-op threads: they are the training's, not a tracker's
    costs: dict[str, dict[str, list[float]]] = {mode: {"wall": [], "calls": [], "cpu": []} for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                for key, values in step_costs(mode, args.steps, Path(tmp) / f"round{round_}").items():
                    costs[mode][key] += values
    base = statistics.median(costs["none"]["wall"])
    print("| log_to | median wall ms/step | vs none | in the trackers' calls, ms/step | trackers' own CPU, ms/step "
          "| direct cost vs none's step | steps |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for mode, mode_costs in costs.items():
        wall = statistics.median(mode_costs["wall"])
        calls, cpu = statistics.mean(mode_costs["calls"]), statistics.mean(mode_costs["cpu"])
        print(f"| {mode} | {1000 * wall:.1f} | {100 * (wall / base - 1):+.2f}% | {1000 * calls:.2f} | {1000 * cpu:.2f} "
              f"| {100 * (calls + cpu) / base:.2f}% | {len(mode_costs['wall'])} |")  # fmt: skip


if __name__ == "__main__":
    main()
