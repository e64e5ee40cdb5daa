"""Speculative decoding through the server: one user streaming greedy completions from `gpt2 serve` plain,
with `--prompt-lookup` and with `--draft`, each server in a process of its own, one after the other; the client is
the `openai` package.

Models as in bench_speculative.py (a target and a draft trained here on the stdlib corpus); prompts: the same
chunks of standard-library source (code continuation), sent as text, --new-tokens greedy tokens each. Reported per
server: tokens/s of the whole request (prefill included; best of --repeats per prompt, summed over prompts), the
ratio to the plain server, and whether every completion's text equals the plain server's.

    flock /tmp/bench.lock python benchmarks/bench_serve_speculative.py --target /tmp/spec2/target \\
        --draft /tmp/spec2/draft
"""

from __future__ import annotations

import argparse
import sys
import time

import openai

from bench_speculative import add_workload_arguments, code_prompts
from common import served
from gpt2.api import LLM

NAME = "target"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    llm = LLM.load(args.target, device="cpu")
    prompts = [llm.tokenizer.decode(ids) for ids in code_prompts(llm, args.prompts, args.prompt_tokens)]
    servers = {"plain": [], "prompt lookup": ["--prompt-lookup"], "draft model": ["--draft", args.draft]}
    speed: dict[str, float] = {}
    texts: dict[str, list[str]] = {}
    for label, flags in servers.items():
        command = [sys.executable, "-m", "gpt2.cli", "serve", "--model", args.target, "--served-model-name", NAME]
        with served([*command, "--log-level", "warning", *flags], args.threads) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
            seconds, texts[label] = 0.0, []
            for prompt in prompts:
                best, text = float("inf"), ""
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    stream = client.completions.create(
                        model=NAME, prompt=prompt, max_tokens=args.new_tokens, temperature=0, stream=True
                    )
                    text = "".join(chunk.choices[0].text for chunk in stream)
                    best = min(best, time.perf_counter() - start)
                seconds += best
                texts[label].append(text)
            tokens = sum(len(llm.tokenizer.encode(text)) for text in texts[label])
            speed[label] = tokens / seconds
    print(
        f"{len(prompts)} prompts x {args.prompt_tokens} tokens, {args.new_tokens} greedy tokens, {args.threads} threads"
    )
    for label in servers:
        same = " (same text as plain)" if texts[label] == texts["plain"] else " (TEXT DIFFERS)"
        print(f"  {label:14s} {speed[label]:7.1f} tok/s  {speed[label] / speed['plain']:5.2f}x{same}")


if __name__ == "__main__":
    main()
