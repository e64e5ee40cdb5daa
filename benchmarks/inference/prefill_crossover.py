"""Where `NativeLinear` should switch from the native product to the dequantized one: a prefill of P tokens both
ways, per precision (what `MANY_ROWS` in gpt2.cpu.kernels is set from).

GPT-2 124M shape, random weights (seeded, no network), prepared as `gpt2 sample --dtype X` prepares it; one
prompt of P tokens through the model with a KV cache (`hidden_states`), the layers' threshold forced to "never"
(native product for every row count) and to "always" (the weight dequantized on the fly, then one matrix product),
alternating; milliseconds, medians of --repeats.

    flock /tmp/bench.lock python benchmarks/inference/prefill_crossover.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from gpt2.bench.timing import interleaved, timed
from gpt2.config import GPTConfig
from gpt2.cpu import kernels
from gpt2.cpu.layouts import prepare_for_inference
from gpt2.model import GPT


@torch.no_grad()
def prefill_ms(model: GPT, tokens: int) -> float:
    ids = torch.arange(100, 100 + tokens).view(1, tokens)
    cache = model.new_kv_cache(1, max_len=tokens)
    return timed(lambda: model.hidden_states(ids, kv_cache=cache, validate=False)) * 1e3


def prefill_with_threshold(model: GPT, tokens: int, precision: str, threshold: int) -> Callable[[], float]:
    """A prefill's milliseconds with the layers' threshold of `precision` set to `threshold` rows."""

    def run() -> float:
        kernels.MANY_ROWS[precision] = threshold
        return prefill_ms(model, tokens)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", default=["int8", "int4", "bfloat16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 16, 24, 32, 40, 48, 56, 63])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"GPT-2 124M shape, CPU, {args.threads} threads; prefill ms, medians of {args.repeats}")
    print(f"{'precision':>9} {'P':>4} {'native':>8} {'dequant':>8}  faster")
    thresholds = dict(kernels.MANY_ROWS)
    try:
        for precision in args.precisions:
            torch.manual_seed(0)
            model = prepare_for_inference(GPT(GPTConfig.from_name("gpt2")).eval(), precision=precision)
            for tokens in args.tokens:
                ways = {name: prefill_with_threshold(model, tokens, precision, threshold)
                        for name, threshold in (("native", 10**9), ("dequantized", 1))}  # fmt: skip
                timings = interleaved(ways, warmup=1, repetitions=args.repeats)
                native, dequantized = (statistics.median(values) for values in timings.values())
                faster = "native" if native < dequantized else "dequantized"
                print(f"{precision:>9} {tokens:>4} {native:>8.1f} {dequantized:>8.1f}  {faster}")
    finally:
        kernels.MANY_ROWS.update(thresholds)


if __name__ == "__main__":
    main()
