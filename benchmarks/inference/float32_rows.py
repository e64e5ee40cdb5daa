"""float32 products in oneDNN from a packed weight (`OneDNNLinear.packed_weight`) against the plain weight, and
where a decode step of B rows should leave the native decoder for the model (`FLOAT32_MAX_ROWS`).

GPT-2 124M shape, random weights (seeded, no network), prepared as `gpt2 serve --dtype float32` prepares it, one
thread running everything (as the server's engine thread is the only one running PyTorch). Alternating, medians
of --repeats (after a warm-up each):

- prefill: a prompt of P tokens through the model with a KV cache (`hidden_states`) and the LM head on its last
  position, oneDNN multiplying by the plain weight (what OneDNNLinear did before) and by the packed one;
- step: one decode step of B rows at positions 64-72 (`DecodeBatch.step`) in the native decoder, and through the model
  with the plain and with the packed weight.

    flock /tmp/bench.lock python benchmarks/inference/float32_rows.py --threads 2
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import torch

from gpt2.bench.timing import interleaved, timed
from gpt2.config import GPTConfig
from gpt2.cpu.layouts import OneDNNLinear, prepare_for_inference
from gpt2.model import GPT
from gpt2.serve.batch import DecodeBatch

PROMPT = 64  # tokens each row of a step has before it


@torch.no_grad()
def prefill(model: GPT, tokens: int) -> None:
    ids = torch.arange(100, 100 + tokens).view(1, tokens)
    hidden = model.hidden_states(ids, kv_cache=model.new_kv_cache(1, max_len=tokens), validate=False)
    model.lm_head(hidden[:, -1])


def stepper(model: GPT, rows: int, native: bool) -> Callable[[], object]:
    """One decode step of `rows` rows per call (a batch of its own: each call is one position further)."""
    batch = DecodeBatch(model, rows)
    batch.join_many([list(range(row, row + PROMPT)) for row in range(rows)])
    assert batch.decoder is not None, "the native kernels did not build here"
    batch.decoder.max_rows = None if native else 0  # None: every step native; 0: every step through the model
    tokens = torch.arange(rows)
    return lambda: batch.step(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 30, 64, 90, 256, 1024])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 6, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = prepare_for_inference(GPT(GPTConfig.from_name("gpt2")).eval(), precision="float32")
    packed_weight = OneDNNLinear.packed_weight

    def plain(layer: OneDNNLinear) -> torch.Tensor:
        return layer.weight

    def case(packed: bool, run: Callable[[], object]) -> Callable[[], float]:
        """Milliseconds of `run`, oneDNN multiplying by the packed weight or by the plain one."""

        def measure() -> float:
            OneDNNLinear.packed_weight = packed_weight if packed else plain  # type: ignore[method-assign]
            return timed(run) * 1e3

        return measure

    def medians(cases: dict[str, tuple[bool, Callable[[], object]]]) -> dict[str, float]:
        """Each case (packed?, run) --repeats times, alternating, after a warm-up of each."""
        try:
            runs = {name: case(packed, run) for name, (packed, run) in cases.items()}
            timings = interleaved(runs, warmup=1, repetitions=args.repeats)
        finally:
            OneDNNLinear.packed_weight = packed_weight  # type: ignore[method-assign]
        return {name: statistics.median(values) for name, values in timings.items()}

    print(f"GPT-2 124M shape, float32, CPU, {args.threads} threads; ms, medians of {args.repeats}")
    print(f"{'prefill P':>10} {'plain':>8} {'packed':>8} {'speedup':>8}")
    for tokens in args.tokens:
        run = functools.partial(prefill, model, tokens)
        result = medians({"plain": (False, run), "packed": (True, run)})
        speedup = result["plain"] / result["packed"]
        print(f"{tokens:>10} {result['plain']:>8.1f} {result['packed']:>8.1f} {speedup:>7.2f}x")
    print(f"\n{'step B':>10} {'native':>8} {'plain':>8} {'packed':>8}  fastest")
    for rows in args.rows:
        cases = {"native": (True, True), "plain": (False, False), "packed": (True, False)}  # (packed?, native?)
        result = medians({name: (packed, stepper(model, rows, native)) for name, (packed, native) in cases.items()})
        fastest = min(result, key=lambda name: result[name])
        print(f"{rows:>10} {result['native']:>8.1f} {result['plain']:>8.1f} {result['packed']:>8.1f}  {fastest}")


if __name__ == "__main__":
    main()
