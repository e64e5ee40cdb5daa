"""The per-step draw from next-token logits: ours against transformers' sampling step and against our own rule
computed over the whole vocabulary.

Logits (B, 50257) float32, random (scaled like a trained model's: standard deviation 4), on CPU, in one run,
alternating. Per setting, microseconds per call (median of --repeats timings of --calls calls):

- ours: `sample_next_token` (top-k draws among the k candidates; gpt2.inference.sampling);
- whole vocabulary: the same rule written out over all V ids (scale, `filter_top_k`, `filter_top_p`, softmax, one
  inverse-CDF draw): what `sample_next_token` computed before the candidates-only path;
- transformers: what `generate(do_sample=True)` does in a step, its own warpers (`TemperatureLogitsWarper`,
  `TopKLogitsWarper`, `TopPLogitsWarper`), softmax and `torch.multinomial` (greedy: argmax).

Checked on the way: ours and the whole-vocabulary rule draw the same ids for the same seed.

    flock /tmp/bench.lock python benchmarks/inference/sampling.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from gpt2.inference.sampling import GREEDY_BELOW_TEMPERATURE, draw, filter_top_k, filter_top_p, sample_next_token

V = 50257
SETTINGS = {  # name: (temperature, top_k, top_p)
    "greedy": (0.0, None, None),
    "T 0.8, top-k 50": (0.8, 50, None),
    "T 0.8, top-k 50, top-p 0.9": (0.8, 50, 0.9),
    "T 1, whole vocabulary": (1.0, None, None),
}


def whole_vocabulary(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, seed: int
) -> torch.Tensor:
    """sample_next_token's rule over all V ids, drawn with a generator seeded `seed`."""
    if temperature < GREEDY_BELOW_TEMPERATURE:
        return logits.argmax(dim=-1)
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        scaled = filter_top_k(scaled, top_k)
    if top_p is not None:
        scaled = filter_top_p(scaled, top_p)
    return draw(torch.softmax(scaled, dim=-1), torch.Generator().manual_seed(seed))


def transformers_step(temperature: float, top_k: int | None, top_p: float | None) -> Callable[[torch.Tensor], object]:
    """One sampling step as transformers' generate(do_sample=True) takes it: its warpers, softmax, multinomial."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if temperature < GREEDY_BELOW_TEMPERATURE:
        return lambda logits: logits.argmax(dim=-1)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        warpers.append(TopPLogitsWarper(top_p))
    ids = torch.zeros(1, 1, dtype=torch.long)

    def step(logits: torch.Tensor) -> object:
        scores = warpers(ids.expand(logits.size(0), 1), logits)
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)

    return step


def microseconds(function: Callable[[], object], calls: int) -> float:
    """Mean microseconds of `calls` calls, after a few unmeasured ones."""
    for _ in range(max(calls // 10, 3)):
        function()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e6


def measure(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, calls: int, repeats: int
) -> list[float]:
    """Microseconds per call of ours, the whole-vocabulary rule and transformers' step: medians of `repeats`
    rounds, each timing the three in turn."""
    generator = torch.Generator().manual_seed(0)
    transformers_draw = transformers_step(temperature, top_k, top_p)
    contenders = [
        lambda: sample_next_token(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator),
        lambda: whole_vocabulary(logits, temperature, top_k, top_p, 0),
        lambda: transformers_draw(logits),
    ]
    rounds = [[microseconds(function, calls) for function in contenders] for _ in range(repeats)]
    return [statistics.median(column) for column in zip(*rounds, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"V = {V}, float32 logits, CPU, {args.threads} threads; microseconds per call (median of {args.repeats})")
    print(f"{'setting':<28} {'rows':>4} {'ours':>8} {'whole V':>8} {'transformers':>12} {'vs whole':>9} {'vs tf':>6}")
    for B in args.rows:
        logits = torch.randn(B, V, generator=torch.Generator().manual_seed(B)) * 4
        for name, (temperature, top_k, top_p) in SETTINGS.items():
            options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
            for seed in range(20):  # the same ids as the rule over the whole vocabulary
                ours = sample_next_token(logits, generator=torch.Generator().manual_seed(seed), **options)
                if not torch.equal(ours, whole_vocabulary(logits, temperature, top_k, top_p, seed)):
                    raise RuntimeError(f"{name}: sample_next_token drew other ids than the whole-vocabulary rule")
            times = measure(logits, temperature, top_k, top_p, args.calls, args.repeats)
            ours_us, whole_us, hf_us = times
            print(
                f"{name:<28} {B:>4} {ours_us:>8.0f} {whole_us:>8.0f} {hf_us:>12.0f} "
                f"{whole_us / ours_us:>8.2f}x {hf_us / ours_us:>5.2f}x"
            )


if __name__ == "__main__":
    main()
