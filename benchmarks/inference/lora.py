"""Many LoRA adapters in one batch (gpt2.inference.lora_batch) against the base model alone: offline throughput
of the same prompts, and what each adapter adds to the process's memory.

GPT-2 124M shape, random weights (seeded, no network), `LLM.load(..., precision="float32")` as `gpt2 sample` and
the server load it; adapters rank --rank on c_attn (random A and B, PEFT's format, written by `save_adapter`).
Alternating, medians of --repeats (after a warm-up each), greedy, --max-tokens new tokens per prompt:

- base: --prompts prompts, no adapter (decode steps where LLM's default puts them: the native decoder up to
  FLOAT32_MAX_ROWS rows, the model's oneDNN path beyond);
- mixed: the same prompts spread round-robin over --adapters adapters, one batch (the model's path, with the
  grouped low-rank product per adapted layer);
- one adapter: every prompt on the first adapter.

    flock /tmp/bench.lock python benchmarks/inference/lora.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gpt2.api import LLM
from gpt2.bench.finetune import peak_rss_mib
from gpt2.bench.setup import BenchSettings, save_model_directory, write_adapters
from gpt2.inference.sampling import SamplingParams

SHARED_DATA = Path(os.environ.get("GPT2_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))

WORDS = "the of and to in a is that for it as was with be by on not he I this are or his from at which".split()


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def prompts(count: int, length: int) -> list[str]:
    return [" ".join(WORDS[(row * 7 + i) % len(WORDS)] for i in range(length)) for row in range(count)]


def tokens_per_second(llm: LLM, texts: list[str], params: SamplingParams, adapter: object) -> float:
    start = time.perf_counter()
    llm.generate(texts, params, adapter=adapter)  # type: ignore[arg-type]
    return len(texts) * params.max_tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as temporary:
        base = Path(temporary) / "base"
        save_model_directory(BenchSettings(tokenizer=str(SHARED_DATA / "gpt2-bpe")), base)
        folders = write_adapters(base, Path(temporary), args.adapters, args.rank)
        llm = LLM.load(base, device="cpu", precision="float32")
        before = current_rss_mb()
        for index, folder in enumerate(folders):
            llm.adapters.add(f"adapter{index}", folder)
        added = current_rss_mb() - before
        adapter_mb = sum(llm.adapters.get(name).nbytes for name in llm.adapters.names) / 2**20
        texts = prompts(args.prompts, args.prompt_words)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
        mixed = [f"adapter{row % args.adapters}" for row in range(args.prompts)]
        cases = {"base": None, "mixed": mixed, "one adapter": "adapter0"}
        for adapter in cases.values():
            tokens_per_second(llm, texts, params.replace(max_tokens=4), adapter)  # warm-up
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, adapter in cases.items():
                results[name].append(tokens_per_second(llm, texts, params, adapter))
    base_rate = statistics.median(results["base"])
    print(f"{args.prompts} prompts x {args.max_tokens} new tokens, {args.threads} threads, median of {args.repeats}")
    for name, rates in results.items():
        rate = statistics.median(rates)
        print(f"{name:12s} {rate:8.1f} tokens/s  ({rate / base_rate:.2f}x base)  runs {[round(r, 1) for r in rates]}")
    print(f"{args.adapters} adapters rank {args.rank}: {adapter_mb:.2f} MiB of weights, RSS +{added:.1f} MiB on adding")
    print(f"peak RSS {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
