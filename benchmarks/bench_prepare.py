"""Data preparation: `gpt2.data.prepare` (streamed, batched) vs the plain nanoGPT-style path.

The plain path reads the whole file, encodes it in one call and writes the ids: the reference for speed and
for the ids (the script checks both give the same token stream before reporting). Each run is a fresh
subprocess so its peak resident memory (VmHWM) is its own; ours and plain alternate, best time of the
rounds, largest peak memory.

    python benchmarks/bench_prepare.py --repeat 20 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import peak_rss_mb
from gpt2.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "data" / "corpora" / "tinyshakespeare.txt"
GPT2_BPE = REPO.parent / "shared" / "data" / "gpt2-bpe"


def run_one(mode: str, corpus: Path, out: Path, chunk_chars: int) -> dict:
    """One timed preparation in this process (called in a subprocess by main)."""
    import numpy as np

    from gpt2.data import PrepareOptions, load_split, prepare

    tokenizer = load_tokenizer(GPT2_BPE)
    start = time.perf_counter()
    if mode == "ours":
        prepare([corpus], out, tokenizer, PrepareOptions(chunk_chars=chunk_chars), progress=False)
    else:  # the plain path: whole file in memory, one encode call
        ids = [tokenizer.eot_token] + tokenizer.encode(corpus.read_text(encoding="utf-8"))
        out.mkdir(parents=True, exist_ok=True)
        np.array(ids, dtype=np.uint16).tofile(out / "all.bin")
        del ids
    seconds = time.perf_counter() - start
    maxrss_mb = peak_rss_mb()  # before the check below adds to it
    if mode == "ours":
        tokens = np.concatenate([load_split(out, "train"), load_split(out, "val")])
    else:
        tokens = np.fromfile(out / "all.bin", dtype=np.uint16)
    np.save(out.parent / f"{mode}.npy", tokens)
    return {"seconds": seconds, "tokens": int(len(tokens)), "maxrss_mb": maxrss_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="corpus = tinyshakespeare repeated this many times")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunk-chars", type=int, default=1 << 18)
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "CORPUS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        mode, corpus, out = args.worker
        print(json.dumps(run_one(mode, Path(corpus), Path(out), args.chunk_chars)))
        return

    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(SHAKESPEARE.read_text(encoding="utf-8") * args.repeat, encoding="utf-8")
        size_mb = corpus.stat().st_size / 1e6
        results: dict[str, list[dict]] = {"ours": [], "plain": []}
        for round_index in range(args.rounds):
            for mode in ("ours", "plain"):
                out = Path(tmp) / f"{mode}-{round_index}" / "out"
                command = [
                    sys.executable,
                    __file__,
                    "--chunk-chars",
                    str(args.chunk_chars),
                    "--worker",
                    mode,
                    str(corpus),
                    str(out),
                ]
                line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()
                results[mode].append(json.loads(line.splitlines()[-1]))
                if mode == "plain":
                    ours = np.load(Path(tmp) / f"ours-{round_index}" / "ours.npy")
                    if not np.array_equal(ours, np.load(out.parent / "plain.npy")):
                        raise SystemExit("ours and plain token streams differ: the figures would mean nothing")
        print(
            f"corpus: tinyshakespeare x{args.repeat} = {size_mb:.2f} MB, {results['ours'][0]['tokens']:,} tokens "
            f"(identical streams), chunk_chars {args.chunk_chars}"
        )
        print("| path | best seconds | tokens/s | MB/s | peak RSS MB |")
        print("|---|---|---|---|---|")
        best = {}
        for mode, runs in results.items():
            best[mode] = min(r["seconds"] for r in runs)
            peak = max(r["maxrss_mb"] for r in runs)
            tokens_per_s = runs[0]["tokens"] / best[mode]
            print(f"| {mode} | {best[mode]:.2f} | {tokens_per_s:,.0f} | {size_mb / best[mode]:.2f} | {peak:.0f} |")
        print(f"| **ratio ours / plain (speed)** | | **{best['plain'] / best['ours']:.2f}x** | | |")


if __name__ == "__main__":
    main()
