"""Time to a target val loss: the AdamW recipe against Muon recipes, on the same data, alternating in one run.

Tasks:
- shakespeare-char: nanoGPT's char-Shakespeare CPU recipe (4 layers, width 128, block 64, batch 12, 2000 steps,
  AdamW lr 1e-3, cosine) re-created with our training loop (not nanoGPT's code) as
  `benchmarks/train/shakespeare_char.py` does: the `shakespeare-char` preset with optimizer=adamw,
  max_steps=2000; target val 1.8857 (nanoGPT's own final value). The preset as shipped (Muon, 1000 steps) is the
  variant `preset:` with no overrides.
- stdlib: the README's main job; an AdamW recipe (learning_rate 2e-3, 1800 steps) against the preset as shipped
  (Muon, 1000 steps); target val 3.906 (where the AdamW recipe ends).

The figure is the training time to the target: the sum of the step times (metrics.jsonl dt_ms) up to the first
evaluation at or below the target (evaluation time and data preparation left out, alike for every recipe). On a
machine shared with other work a burst of load lengthens some steps of one recipe and not another's, so each row
also gives the median step time and the step at the target: their product is the time to the target at that
machine's steady speed. The data is tokenized once up front. Each variant is `name:key=value,key=value`
(overrides of the preset).

    flock /tmp/bench.lock python benchmarks/train/time_to_loss.py --task shakespeare-char
    flock /tmp/bench.lock python benchmarks/train/time_to_loss.py --task stdlib --eval-interval 100

Without --variant, a task runs its AdamW baseline (BASELINES) and the preset as shipped (`preset:`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gpt2.data.cache import DataSpec, prepare_data
from gpt2.train import train
from gpt2.train.config import TrainConfig, parse_overrides

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPT2_SHARED_DATA", REPO.parent / "shared" / "data"))
TARGETS = {"shakespeare-char": 1.8857, "stdlib": 3.906}
# The AdamW recipes the targets come from, as overrides of today's presets.
BASELINES: dict[str, dict[str, Any]] = {
    "shakespeare-char": {"optimizer": "adamw", "max_steps": 2000},
    "stdlib": {"optimizer": "adamw", "max_steps": 1800, "learning_rate": 2e-3},
}


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, _, settings = text.partition(":")
    return name, parse_overrides(TrainConfig, [item for item in settings.split(",") if item], "variant")


def time_to_target(out_dir: Path, target: float) -> tuple[float | None, int | None]:
    """(training seconds, step) at the first evaluation with val loss <= target; (None, None) if never."""
    seconds = 0.0
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "dt_ms" in record:
            seconds += record["dt_ms"] / 1000
        elif "val_loss" in record and record["val_loss"] <= target:
            return seconds, record["step"]
    return None, None


def median_step_ms(out_dir: Path) -> float:
    """The median step time of a run (metrics.jsonl dt_ms), robust to bursts of load from other work."""
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return statistics.median(record["dt_ms"] for record in map(json.loads, lines) if "dt_ms" in record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=list(TARGETS), default="shakespeare-char")
    parser.add_argument("--variant", action="append", type=parse_variant, help="name:key=value,... (repeatable)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--target", type=float, help="val loss to reach (default: the task's, TARGETS)")
    parser.add_argument("--eval-interval", type=int, default=50, help="steps between val evaluations")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = args.variant or [("adamw", BASELINES[args.task]), ("preset", {})]
    target = args.target or TARGETS[args.task]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = TrainConfig.from_name(args.task, device="cpu", dtype="float32", sample_tokens=0, checkpoint_interval=0)
        if args.task == "shakespeare-char":
            base = base.replace(data=str(SHARED / "corpora" / "tinyshakespeare.txt"))
        spec = DataSpec(data=base.data.source, tokenizer=base.data.tokenizer, vocab_size=base.data.vocab_size,
                        max_corpus_bytes=base.data.max_corpus_bytes, val_fraction=base.data.val_fraction)  # fmt: skip
        _, data_dir = prepare_data(spec, Path(tmp) / "data")
        base = base.replace(data=str(data_dir), tokenizer=str(data_dir / "tokenizer"), eval_interval=args.eval_interval)
        for repeat in range(args.repeats):
            for name, overrides in variants:  # alternating: a loaded machine slows every recipe alike
                config = base.replace(out_dir=str(Path(tmp) / f"{name}-{repeat}"), **overrides)
                started = time.perf_counter()
                result = train(config)
                wall = time.perf_counter() - started
                seconds, step = time_to_target(Path(config.output.out_dir), target)
                row = {
                    "task": args.task, "variant": name, "overrides": overrides, "repeat": repeat,
                    "target": target, "time_to_target_s": None if seconds is None else round(seconds, 1),
                    "step_at_target": step, "final_val": round(result.val_losses[result.step], 4),
                    "steps": result.step, "train_s": round(sum(json.loads(line).get("dt_ms", 0) for line in
                    (Path(config.output.out_dir) / "metrics.jsonl").read_text().splitlines()) / 1000, 1),
                    "ms_per_step": round(1000 * result.seconds / result.step, 1), "wall_s": round(wall, 1),
                    "median_ms_per_step": round(median_step_ms(Path(config.output.out_dir)), 1),
                    "val_by_step": {step: round(loss, 4) for step, loss in result.val_losses.items()},
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
