"""Structured output: the grammar mask's cost per token against a decode step, batch 1, CPU, float32.

GPT-2 124M shape (random weights, GPT-2's 50257-token BPE from the shared data), prompt of --prompt-tokens. Per
grammar (a JSON schema, any JSON object, a regex): the tokens of one constrained continuation are replayed
through a fresh `GrammarMask` call by call (accept the new token, fill the bitmask, mask the logits: all of what
a decode step adds), timed per token (median); beside it, the median plain decode step (`stream`, native decoder
where it builds) and the end-to-end tokens/s of `stream_text` with and without the grammar. Goal: mask <= 20% of
a step.

    flock /tmp/bench.lock python benchmarks/inference/structured.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from gpt2.config import GPTConfig
from gpt2.inference.generation import stream_text
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.structured import JSON_OBJECT, GrammarCompiler, GrammarMask
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "admin": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "admin"],
    "additionalProperties": False,
}
GRAMMARS = {
    "json_schema": {"json_schema": SCHEMA},
    "json_object": {"json_schema": JSON_OBJECT},
    "regex": {"regex": r"[A-Z][a-z]{2,12}( [a-z]{1,10}){3,6}\."},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shared = Path(os.environ.get("GPT2_SHARED_DATA", "../shared/data"))
    tokenizer = load_tokenizer(shared / "gpt2-bpe")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("gpt2")).eval()
    prompt = tokenizer.encode("A user record as JSON, or a sentence: " * 8)[: args.prompt_tokens]

    start = time.perf_counter()
    compiler = GrammarCompiler(tokenizer, vocab_size=model.config.vocab_size)
    print(f"tokenizer tables for xgrammar: {time.perf_counter() - start:.2f} s (once per tokenizer)")

    plain = SamplingParams(max_tokens=args.new_tokens, temperature=0)
    step = _decode_step_ms(model, tokenizer, prompt, plain)
    print(f"decode step (124M, batch 1, float32, threads {args.threads}): {step:.2f} ms median")
    print(f"{'grammar':12s} {'compile ms':>10s} {'mask ms/token':>14s} {'% of step':>10s} {'tokens':>7s}")
    for name, fields in GRAMMARS.items():
        start = time.perf_counter()
        compiled = compiler.compile(**fields)  # type: ignore[arg-type]
        compile_ms = (time.perf_counter() - start) * 1e3
        params = plain.replace(**fields)
        text = "".join(stream_text(model, tokenizer, prompt, params))
        generated = tokenizer.encode(text)
        mask = GrammarMask(compiled)
        ids = torch.tensor([prompt + generated])
        times = []
        V = model.config.vocab_size
        for n in range(len(prompt), ids.size(1) + 1):
            logits = torch.randn(1, V)
            begin = time.perf_counter()
            mask(ids[:, :n], logits)
            times.append((time.perf_counter() - begin) * 1e3)
        cost = statistics.median(times)
        print(f"{name:12s} {compile_ms:10.1f} {cost:14.3f} {100 * cost / step:9.1f}% {len(generated):7d}  {text!r}")


def _decode_step_ms(model: GPT, tokenizer: object, prompt: list[int], params: SamplingParams) -> float:
    """Median time between the tokens of a plain greedy continuation (the first, which includes the prefill,
    left out)."""
    stamps = []
    for _ in stream_text(model, tokenizer, prompt, params.replace(stop_token_ids=()), slide_by=None):  # type: ignore[arg-type]
        stamps.append(time.perf_counter())
    return statistics.median(b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)) * 1e3


if __name__ == "__main__":
    main()
