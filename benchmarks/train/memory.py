"""Training memory does not depend on corpus size: peak RSS of a short training run on a prepared corpus 10x larger.

Two folders of random byte-tokenizer ids are written directly with numpy (`save_token_shards`, shards of
`--shard-tokens`): a small corpus (`--small-tokens`, default 4M) and one 10x larger (40M: 80 MB of uint16 more).
Each training run (a gpt2-tiny-sized model, a few steps, an evaluation, the final checkpoint) is a fresh
subprocess whose peak resident memory (VmHWM) is its own. The claim holds when the large run's peak is within
`--bound-mb` (60) of the small one's; the script exits 1 otherwise.

Two control runs show the benchmark sees a design whose memory grows with the corpus: "concatenated" reads each
split into memory as load_split did before views (`np.asarray(load_split(...))`); "mapped, pages kept" reads
through the views but never gives the mapped pages back (`TokenView.release` disabled), so the kernel's
read-ahead around each random window stays in the process and adds up towards the whole corpus.

    flock /tmp/bench.lock python benchmarks/train/memory.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gpt2.bench.finetune import peak_rss_mib
from gpt2.data import save_token_shards
from gpt2.tokenizer import ByteTokenizer

VAL_TOKENS = 200_000
MODES = ("views", "mapped, pages kept", "concatenated")


def synthesize(folder: Path, tokens: int, shard_tokens: int, seed: int) -> None:
    """A prepared folder of `tokens` random byte-tokenizer ids in shards of `shard_tokens` (+ a small val split)."""
    rng = np.random.default_rng(seed)
    shards = [rng.integers(0, 257, size=min(shard_tokens, tokens - start), dtype=np.uint16)
              for start in range(0, tokens, shard_tokens)]  # fmt: skip
    save_token_shards(folder, {"train": shards, "val": [rng.integers(0, 257, size=VAL_TOKENS, dtype=np.uint16)]},
                      ByteTokenizer())  # fmt: skip


def run_one(data: Path, out: Path, mode: str, steps: int) -> dict:
    """One short training run in this process (called in a subprocess by main)."""
    from gpt2.train import pretrain, train
    from gpt2.train.config import TrainConfig

    if mode == "concatenated":  # control: every split read into memory, as load_split did before views
        view_of = pretrain.load_split
        pretrain.load_split = lambda data_dir, split: np.asarray(view_of(data_dir, split))  # type: ignore[assignment]
    elif mode == "mapped, pages kept":  # control: the mapped pages are never given back
        from gpt2.data import TokenView

        TokenView.release = lambda self, shards=None: None  # type: ignore[method-assign]
    config = TrainConfig.from_dict(dict(
        data=str(data), tokenizer="bytes", model="gpt2-tiny", n_layer=2, n_head=4, n_embd=64, block_size=128,
        dropout=0.0, batch_size=16, max_steps=steps, warmup_steps=1, eval_interval=steps, eval_batches=2,
        checkpoint_interval=0, sample_tokens=0, device="cpu", dtype="float32", out_dir=str(out),
    ))  # fmt: skip
    start = time.perf_counter()
    result = train(config)
    return {
        "maxrss_mb": peak_rss_mib(),
        "seconds": time.perf_counter() - start,
        "final_loss": result.losses[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-tokens", type=int, default=4_000_000)
    parser.add_argument("--scale", type=int, default=10, help="the large corpus is this many times the small one")
    parser.add_argument("--shard-tokens", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps (16 random windows each)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per corpus (the largest peak counts)")
    parser.add_argument("--bound-mb", type=float, default=60.0)
    parser.add_argument("--worker", nargs=3, metavar=("DATA", "OUT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        data, out, mode = args.worker
        print(json.dumps(run_one(Path(data), Path(out), mode, args.steps)))
        return

    sizes = {"small": args.small_tokens, "large": args.small_tokens * args.scale}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tokens in sizes.items():
            synthesize(Path(tmp) / name, tokens, args.shard_tokens, seed=len(name))
        peaks: dict[tuple[str, str], float] = {}
        for mode in MODES:
            for round_index in range(args.rounds if mode == "views" else 1):
                for name in sizes:
                    out = Path(tmp) / f"run-{MODES.index(mode)}-{name}-{round_index}"
                    command = [sys.executable, __file__, "--steps", str(args.steps),
                               "--worker", str(Path(tmp) / name), str(out), mode]  # fmt: skip
                    line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()
                    result = json.loads(line.splitlines()[-1])
                    peaks[mode, name] = max(peaks.get((mode, name), 0.0), result["maxrss_mb"])

    print(f"model gpt2-tiny (2 layers, 64 wide, block 128, batch 16), {args.steps} steps + 1 evaluation; shards "
          f"of {args.shard_tokens:,} tokens; peak RSS: max VmHWM of {args.rounds} run(s), controls 1")  # fmt: skip
    print("| split read as | small corpus | large corpus | peak RSS small MB | peak RSS large MB | difference MB |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        small, large = peaks[mode, "small"], peaks[mode, "large"]
        print(f"| {mode} | {sizes['small']:,} tok | {sizes['large']:,} tok | {small:.0f} | {large:.0f} | "
              f"{large - small:+.0f} |")  # fmt: skip
    difference = peaks["views", "large"] - peaks["views", "small"]
    verdict = "within" if difference <= args.bound_mb else "OVER"
    corpus_mb = (sizes["large"] - sizes["small"]) * 2 / 1e6
    print(f"views: the {args.scale}x corpus costs {difference:+.1f} MB of peak RSS, {verdict} the "
          f"{args.bound_mb:.0f} MB bound (the corpus itself is {corpus_mb:.0f} MB more)")  # fmt: skip
    if difference > args.bound_mb:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
