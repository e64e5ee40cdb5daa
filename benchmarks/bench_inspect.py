"""What looking inside costs: `run_with_cache` (every activation kept) against the model's plain forward.

Both run under torch.no_grad on the same random tokens, interleaved (plain, cached with no names, cached with
every name) so machine noise hits all alike; the figure is the median time of each and the ratio to the
plain forward. "no names" isolates the instrumented forward itself (written-out attention instead of the
fused kernel, a Python call per activation); "all names" adds keeping every tensor alive (183 of them at the
124M shape) instead of freeing and reusing the memory.

    flock /tmp/bench.lock python benchmarks/bench_inspect.py                     # 124M shape, T=256, B=1,2,4
    flock /tmp/bench.lock python benchmarks/bench_inspect.py --batch-sizes 1 --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time

import torch

from gpt2.config import GPTConfig
from gpt2.inspect import run_with_cache
from gpt2.model import GPT


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2", help="model shape (default gpt2: 124M)")
    parser.add_argument("--batch-sizes", default="1,2,4", help="comma-separated batch sizes (default 1,2,4)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each variant (median reported)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = GPTConfig.from_name(args.preset)
    model = GPT(config).eval()
    print(
        f"# {args.preset}: {model.num_parameters() / 1e6:.0f}M parameters, T={args.seq_len}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.processor() or platform.machine()}"
    )
    print(f"{'B':>3} {'plain ms':>10} {'no names ms':>12} {'all names ms':>13} {'ratio none':>11} {'ratio all':>10}")
    results = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        idx = torch.randint(0, config.vocab_size, (batch_size, args.seq_len))
        variants = {
            "plain": functools.partial(model, idx),
            "no_names": functools.partial(run_with_cache, model, idx, []),
            "all_names": functools.partial(run_with_cache, model, idx),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        with torch.no_grad():
            for fn in variants.values():  # warm-up: allocator, kernels' first-call setup
                fn()
            for _ in range(args.repeats):
                for name, fn in variants.items():
                    times[name].append(timed(fn))
        median = {name: statistics.median(values) for name, values in times.items()}
        row = {
            "batch_size": batch_size,
            "seq_len": args.seq_len,
            **{f"{name}_ms": round(1000 * value, 1) for name, value in median.items()},
            "ratio_no_names": round(median["no_names"] / median["plain"], 3),
            "ratio_all_names": round(median["all_names"] / median["plain"], 3),
        }
        results.append(row)
        print(
            f"{batch_size:>3} {row['plain_ms']:>10} {row['no_names_ms']:>12} {row['all_names_ms']:>13} "
            f"{row['ratio_no_names']:>11} {row['ratio_all_names']:>10}"
        )
    print(json.dumps({"preset": args.preset, "threads": torch.get_num_threads(), "results": results}))


if __name__ == "__main__":
    main()
