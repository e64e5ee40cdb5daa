"""Quality check: nanoGPT's char-Shakespeare CPU recipe on bytes (the "shakespeare-char" preset with
optimizer=adamw, max_steps=2000) with the real training loop.

4 layers, 4 heads, width 128, block 64, batch 12, 2000 iterations, lr 1e-3 (100 warmup steps, cosine to 1e-4),
beta2 0.99, dropout 0; val = the last 10% of tinyshakespeare. Published figure for that setup (65-character
vocabulary): val loss 1.88. Reports the loop's val loss (20 random batches, as nanoGPT), the loss over the
whole val split, wall time and ms per iteration, for each autocast dtype asked for.

    python benchmarks/train/shakespeare_char.py                      # float32 and bfloat16
    python benchmarks/train/shakespeare_char.py --dtype float32 --threads 2

Reads GPT2_SHARED_DATA/corpora/tinyshakespeare.txt (default ../shared/data relative to the repo).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from gpt2.data import BatchLoader, load_split
from gpt2.train import train
from gpt2.train.config import TrainConfig
from gpt2.weights import load_model

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPT2_SHARED_DATA", REPO.parent / "shared" / "data"))
PUBLISHED_VAL_LOSS = 1.88


@torch.no_grad()
def full_val_loss(out_dir: Path, config: TrainConfig) -> float:
    """Mean loss over every block of the val split (consecutive windows), in float32."""
    model = load_model(out_dir)
    tokens = load_split(out_dir / "data", "val")
    T = model.config.block_size
    loader = BatchLoader(tokens, 64, T, shuffle=False)
    windows = loader.num_windows
    total, count = 0.0, 0
    for _ in range(math.ceil(windows / 64)):
        x, y = loader.next_batch()
        rows = min(64, windows - count)
        total += float(model(x[:rows], y[:rows]).loss) * rows
        count += rows
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16"], help="repeatable")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--max-steps", type=int, default=None, help="override the 2000 iterations (smoke runs)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = SHARED / "corpora" / "tinyshakespeare.txt"
    if not data.is_file():
        raise SystemExit(f"{data} is missing; set GPT2_SHARED_DATA")
    results = []
    for dtype in args.dtype or ["float32", "bfloat16"]:
        with tempfile.TemporaryDirectory() as tmp:
            # nanoGPT's recipe: AdamW for 2000 steps (the preset ships Muon for 1000 steps: time_to_loss.py)
            overrides = dict(
                data=str(data),
                out_dir=tmp,
                dtype=dtype,
                device="cpu",
                sample_tokens=0,
                optimizer="adamw",
                max_steps=2000,
            )
            if args.max_steps:
                overrides["max_steps"] = args.max_steps
            config = TrainConfig.from_name("shakespeare-char", **overrides)
            start = time.perf_counter()
            result = train(config)
            wall = time.perf_counter() - start
            full = full_val_loss(Path(tmp), config)
            row = {
                "dtype": dtype,
                "steps": result.step,
                "val_loss_20_batches": round(result.val_losses[result.step], 4),
                "val_loss_full_split": round(full, 4),
                "train_loss_last": round(result.losses[-1], 4),
                "wall_s": round(wall, 1),
                "ms_per_iter": round(1000 * result.seconds / result.step, 1),
                "tokens_per_s": round(result.tokens_per_second),
                "val_curve": {str(k): round(v, 4) for k, v in result.val_losses.items()},
                "threads": torch.get_num_threads(),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    print(f"published: val loss {PUBLISHED_VAL_LOSS} (65-char vocab); target: <= {PUBLISHED_VAL_LOSS}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
