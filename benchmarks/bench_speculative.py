"""Speculative decoding against plain decoding, side by side in one run: batch 1, float32, CPU.

A target model and a draft model trained here on the same data (the stdlib preset: Python's standard library
source), e.g.

    gpt2 train stdlib --set max_steps=250 --out-dir /tmp/spec/target                  # 4 layers x 128
    gpt2 train stdlib --set n_layer=1 --set max_steps=250 --out-dir /tmp/spec/draft   # 4x fewer block weights

Prompts: --prompts chunks of Python source from the standard library (code continuation), --prompt-tokens long,
each continued by --new-tokens tokens. Per mode (plain, prompt lookup, draft model; greedy and sampled), cases
alternate and each is timed --repeats times; the table takes each one's best total. Reports tokens/s, the ratio
to plain and the acceptance rate (accepted / drafted tokens).

    flock /tmp/bench.lock python benchmarks/bench_speculative.py --target /tmp/spec/target --draft /tmp/spec/draft
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections.abc import Callable, Iterator

import torch

from gpt2.api import LLM
from gpt2.inference.generation import stream_text
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.speculative import DraftModel, PromptLookup, SpeculationStats, speculative_text


def code_prompts(llm: LLM, count: int, length: int) -> list[list[int]]:
    """Chunks of standard-library source, `length` tokens each, from modules of several kinds."""
    import argparse as m1
    import dataclasses as m2
    import json.decoder as m3
    import textwrap as m4

    prompts = []
    for module in (m1, m2, m3, m4)[:count]:
        ids = llm.tokenizer.encode(inspect.getsource(module))
        middle = len(ids) // 2
        prompts.append(ids[middle : middle + length])
    return prompts


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The models and the code-continuation workload (also bench_serve_speculative.py's)."""
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--lookup-tokens", type=int, default=10)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--draft-confidence", type=float, default=0.4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    llm = LLM.load(args.target, device="cpu", precision="float32")
    draft = LLM.load(args.draft, device="cpu", precision="float32").model
    prompts = code_prompts(llm, args.prompts, args.prompt_tokens)
    print(
        f"target {sum(p.numel() for p in llm.model.parameters()):,} parameters, draft "
        f"{sum(p.numel() for p in draft.parameters()):,}; {len(prompts)} prompts x {args.prompt_tokens} tokens, "
        f"{args.new_tokens} new, threads {args.threads}"
    )

    def plain(params: SamplingParams, prompt: list[int], stats: SpeculationStats) -> Iterator[str]:
        return stream_text(llm.model, llm.tokenizer, prompt, params)

    def lookup(params: SamplingParams, prompt: list[int], stats: SpeculationStats) -> Iterator[str]:
        drafter = PromptLookup(num_tokens=args.lookup_tokens)
        return speculative_text(llm.model, llm.tokenizer, prompt, params, drafter, stats=stats)

    def drafted(params: SamplingParams, prompt: list[int], stats: SpeculationStats) -> Iterator[str]:
        drafter = DraftModel(draft, num_tokens=args.draft_tokens, confidence=args.draft_confidence)
        return speculative_text(llm.model, llm.tokenizer, prompt, params, drafter, stats=stats)

    modes: dict[str, Callable[..., Iterator[str]]] = {"plain": plain, "prompt lookup": lookup, "draft model": drafted}
    for label, params in [
        ("greedy", SamplingParams(max_tokens=args.new_tokens, temperature=0)),
        ("sampled T=0.7", SamplingParams(max_tokens=args.new_tokens, temperature=0.7, seed=0)),
    ]:
        best: dict[str, float] = {}
        counts: dict[str, SpeculationStats] = {}
        texts: dict[str, list[str]] = {}
        for _ in range(args.repeats):
            for name, run in modes.items():
                stats = SpeculationStats()
                outputs = []
                tokens = 0
                start = time.perf_counter()
                for prompt in prompts:
                    text = "".join(run(params, prompt, stats))
                    outputs.append(text)
                    tokens += len(llm.tokenizer.encode(text))
                elapsed = time.perf_counter() - start
                best[name] = max(best.get(name, 0.0), tokens / elapsed)
                counts[name], texts[name] = stats, outputs
        print(f"\n{label}: tokens/s (best of {args.repeats}), ratio to plain, acceptance rate, tokens per verification")
        for name in modes:
            stats = counts[name]
            same = " (same text as plain)" if texts[name] == texts["plain"] else ""
            extra = ""
            if stats.verifications:
                per = stats.generated / stats.verifications
                extra = f"  acceptance {stats.acceptance_rate:.2f}  {per:.2f} tokens/verification"
            print(f"  {name:14s} {best[name]:8.1f} tok/s  {best[name] / best['plain']:5.2f}x{extra}{same}")


if __name__ == "__main__":
    main()
