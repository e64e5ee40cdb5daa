"""One user of the server against the same model offline: what the server adds to a lone streamed request.

GPT-2 124M shape, random weights (seeded, no network) saved with save_pretrained next to the GPT-2 tokenizer
files, on CPU. In one run, interleaved round by round:

- offline: `LLM.stream` of that directory, loaded as `gpt2 serve` loads it (`LLM.load`, --dtype);
- server: a real `gpt2 serve` process on a loopback port, one streamed /v1/completions request at a time.

Both get the same prompts (--prompt-tokens random token ids, sent as ids; a new one each round, so that the
server's prefix cache reuses nothing), --max-tokens new tokens, seeded sampling (temperature 0.8, top-k 50) and
end-of-text biased away, so both generate exactly max_tokens tokens.

- time to first token: offline, a whole `LLM.stream` call with max_tokens=1 (the prefill and one draw); server,
  from sending the request to the first streamed chunk (every token has a chunk);
- decode tokens/s after the first token: offline, (max_tokens - 1) / (a full call's time - the time to first
  token); server, (max_tokens - 1) / (last token's chunk - first chunk).

Medians over --rounds. Reported: both, and server / offline (decode speed ratio, time-to-first-token ratio).

    flock /tmp/bench.lock python benchmarks/bench_serve_single.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from common import SERVED_MODEL as MODEL
from common import gpt2_serve_command, save_random_gpt2, served
from gpt2.api import LLM
from gpt2.inference.layouts import PRECISIONS
from gpt2.inference.sampling import SamplingParams

SEED = 0
END_OF_TEXT = 50256
NO_END_OF_TEXT = -100.0  # its logit bias: random weights could draw it, and every request must run max_tokens
TEMPERATURE, TOP_K = 0.8, 50


def offline_seconds(llm: LLM, prompt: list[int], max_tokens: int) -> float:
    """Seconds of one whole `LLM.stream` call (every piece consumed)."""
    params = SamplingParams(
        max_tokens=max_tokens, temperature=TEMPERATURE, top_k=TOP_K, seed=SEED, logit_bias={END_OF_TEXT: -100}
    )
    start = time.perf_counter()
    for _ in llm.stream(prompt, params):
        pass
    return time.perf_counter() - start


def served_times(http: httpx.Client, prompt: list[int], max_tokens: int) -> list[float]:
    """Seconds from sending one streamed completion to each token's chunk.

    The events are counted in the bytes as they arrive, no JSON parsed: the client runs on the same cores as the
    server's decode, so its work per token is kept small (httpx still costs ~0.2 ms of CPU a token on 2 cores)."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": TEMPERATURE,
        "top_k": TOP_K,
        "seed": SEED,
        "logit_bias": {str(END_OF_TEXT): NO_END_OF_TEXT},
        "stream": True,
    }
    times: list[float] = []
    pending = b""  # an event not complete yet
    start = time.perf_counter()
    with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for data in response.iter_raw():
            now = time.perf_counter() - start
            *events, pending = (pending + data).split(b"\n\n")
            times += [now for event in events if event.startswith(b"data: {")]
    if len(times) != max_tokens:
        raise RuntimeError(f"expected a chunk per token ({max_tokens}), got {len(times)}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", choices=PRECISIONS, default="float32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(SEED)
    prompts = [[rng.randrange(50000) for _ in range(args.prompt_tokens)] for _ in range(args.rounds + 1)]
    n = args.max_tokens
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder) / "model"
        save_random_gpt2(directory, SEED)
        llm = LLM.load(directory, device="cpu", precision=args.dtype)
        command = gpt2_serve_command(directory, args.dtype)
        with served(command, args.threads) as url, httpx.Client(base_url=url, timeout=600) as http:
            offline_seconds(llm, prompts[-1], 4)  # warm-up: first-call costs out of the figures
            served_times(http, prompts[-1], 4)
            offline_first, offline_decode, served_first, served_decode = [], [], [], []
            for prompt in prompts[: args.rounds]:
                first = offline_seconds(llm, prompt, 1)
                offline_first.append(first)
                offline_decode.append((n - 1) / (offline_seconds(llm, prompt, n) - first))
                times = served_times(http, prompt, n)
                served_first.append(times[0])
                served_decode.append((n - 1) / (times[-1] - times[0]))
    result: dict[str, Any] = {
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": n,
        "dtype": args.dtype,
        "threads": args.threads,
        "rounds": args.rounds,
        "offline_ttft_s": statistics.median(offline_first),
        "offline_tokens_per_s": statistics.median(offline_decode),
        "served_ttft_s": statistics.median(served_first),
        "served_tokens_per_s": statistics.median(served_decode),
    }
    result["decode_ratio"] = result["served_tokens_per_s"] / result["offline_tokens_per_s"]
    result["ttft_ratio"] = result["served_ttft_s"] / result["offline_ttft_s"]
    print(
        f"GPT-2 124M shape, random weights, {args.dtype}, CPU, {args.threads} torch threads; prompt "
        f"{args.prompt_tokens} tokens, {n} new tokens, median of {args.rounds} rounds"
    )
    print(f"{'':>8} {'ttft ms':>8} {'decode tok/s':>13}")
    print(f"{'offline':>8} {result['offline_ttft_s'] * 1e3:>8.1f} {result['offline_tokens_per_s']:>13.1f}")
    print(f"{'server':>8} {result['served_ttft_s'] * 1e3:>8.1f} {result['served_tokens_per_s']:>13.1f}")
    print(
        f"server / offline: decode speed {result['decode_ratio']:.3f}, time to first token {result['ttft_ratio']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
