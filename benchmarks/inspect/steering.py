"""What steering costs a decode step: the same greedy decode of B rows on the model's PyTorch path, plain, with
one row steered, and with every row steered (one vector added at one hook, gpt2.inference.steering).

Steered generation runs the model's PyTorch forward (the hooks are module hooks), so the baseline here is that
path too (native=False); the native CPU step's own speed is in docs/performance.md. Figures: the median over
--repeats runs of one generation's time (a 16-token prompt's prefill, then --steps steps) divided by --steps,
variants interleaved.

    flock /tmp/bench.lock python benchmarks/inspect/steering.py                    # 124M shape, B=8
    flock /tmp/bench.lock python benchmarks/inspect/steering.py --batch-size 1 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from collections.abc import Callable

import torch

from gpt2.bench.timing import interleaved, timed
from gpt2.config import GPTConfig
from gpt2.inference.generation import generate
from gpt2.inference.steering import AddVector, steer
from gpt2.model import GPT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hook", default="blocks.6.hook_resid_pre")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = GPTConfig.from_name(args.preset)
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (args.batch_size, 16))
    vector = AddVector(args.hook, torch.randn(config.n_embd), 4.0)
    plans = {
        "plain": None,
        "one_row": [[vector]] + [[] for _ in range(args.batch_size - 1)] if args.batch_size > 1 else [[vector]],
        "every_row": [[vector]],
    }

    def ms_per_step(plan: list[list[AddVector]] | None) -> Callable[[], float]:
        """Milliseconds a step of one generation takes under `plan` (None: unsteered)."""

        def generation() -> None:
            generate(model, idx, args.steps, temperature=0.0, native=False, stop_token_ids=[])

        def run() -> float:
            with steer(model, plan) if plan else contextlib.nullcontext():
                return 1000 * timed(generation) / args.steps

        return run

    runs = {name: ms_per_step(plan) for name, plan in plans.items()}
    with torch.no_grad():
        times = interleaved(runs, warmup=1, repetitions=args.repeats)
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, value in median.items():
        print(f"{name:>10}: {value:7.2f} ms a step ({value / median['plain'] - 1:+.1%})")
    print(
        json.dumps(
            {
                "preset": args.preset,
                "batch_size": args.batch_size,
                **{f"{k}_ms": round(v, 2) for k, v in median.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
