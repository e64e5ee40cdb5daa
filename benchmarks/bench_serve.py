"""The server under concurrent clients: continuous batching against one request at a time, same run.

GPT-2 124M shape, random weights (no network), on CPU, served in-process by `gpt2 serve`'s app on a loopback
port. Each of C clients (C in --clients, default 1, 4, 16, 64) sends --requests streamed completions one after the
other: a --prompt-tokens-token prompt, --max-tokens new tokens, seeded sampling, end-of-text biased away so
every request generates exactly max_tokens. Two servers per C, interleaved:

- batched: continuous batching (--max-batch rows, default 16);
- one at a time: the same server with max_batch=1 (requests wait in the queue and are decoded alone).

Reported per C and mode: aggregate tokens/s (completion tokens of all requests / wall time of the run), request
latency p50 / p99 (send to last token), time to first token p50 / p99 (send to the first streamed chunk, which
carries the first token; a request that waits in the queue for a row counts its wait), and time to the first text
(later when the first tokens end inside a multi-byte character, which random weights draw often). With few
requests p99 is close to the maximum.

    flock /tmp/bench.lock python benchmarks/bench_serve.py --threads 2
    flock /tmp/bench.lock python benchmarks/bench_serve.py --fuzz 1000      # also: 1000 random bodies, 0 5xx
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import torch

from common import percentile
from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.cpu.layouts import PRECISIONS, prepare_for_inference
from gpt2.model import GPT
from gpt2.serve import ServerConfig, uvicorn_server
from gpt2.serve.server import on_passing_thread
from gpt2.tokenizer import ByteTokenizer, load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer

SEED = 0
MODEL = "gpt2-124m-random"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NO_END_OF_TEXT = {"50256": -100}  # random weights could draw <|endoftext|>: every request then has max_tokens


def build_llm(precision: str) -> LLM:
    torch.manual_seed(SEED)
    model = GPT(GPTConfig.from_name("gpt2"))
    prepare_for_inference(model, precision)
    return LLM(model, bpe_or_bytes(), torch.device("cpu"))


def bpe_or_bytes() -> TextTokenizer:
    bpe = SHARED_DATA / "gpt2-bpe"
    return load_tokenizer(bpe) if (bpe / "encoder.json").exists() else ByteTokenizer()


@contextmanager
def running(llm: LLM, max_batch: int) -> Iterator[str]:
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP (else each small write
    # of a keep-alive connection waits ~40 ms for a delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = ServerConfig(model_name=MODEL, port=port, max_batch=max_batch, max_queue=256)
    # built on a thread that ends, as `gpt2 serve` does: the engine's is then the only thread with OpenMP workers
    server = on_passing_thread(lambda: uvicorn_server(llm, config, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def one_request(http: httpx.Client, body: dict[str, Any]) -> tuple[float, float, float, int]:
    """(seconds to the first token, to the first text, to the end; completion tokens) of one streamed completion.

    The server sends a chunk for every token; a token that ends inside a multi-byte character comes with empty
    text (the text waits for the character's last byte), so with random weights the first text can trail the
    first token by a few decode steps."""
    start = time.perf_counter()
    first_token = first_text = None
    tokens = 0
    with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"]:
                now = time.perf_counter() - start
                first_token = now if first_token is None else first_token
                if first_text is None and chunk["choices"][0]["text"]:
                    first_text = now
    end = time.perf_counter() - start
    return (first_token or end), (first_text or end), end, tokens


def run_clients(url: str, clients: int, requests: int, prompt: str, max_tokens: int) -> dict[str, float]:
    def client(index: int) -> list[tuple[float, float, float, int]]:
        results = []
        with httpx.Client(base_url=url, timeout=3600) as http:
            for number in range(requests):
                body = {
                    "model": MODEL,
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "temperature": 0.8,
                    "top_k": 50,
                    "seed": index * 1000 + number,
                    "logit_bias": NO_END_OF_TEXT,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                results.append(one_request(http, body))
        return results

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [item for part in pool.map(client, range(clients)) for item in part]
    wall = time.perf_counter() - start
    latencies = sorted(end for _, _, end, _ in results)
    first_tokens = sorted(first for first, _, _, _ in results)
    first_texts = sorted(text for _, text, _, _ in results)
    return {
        "requests": len(results),
        "tokens": sum(tokens for _, _, _, tokens in results),
        "wall_s": wall,
        "tokens_per_s": sum(tokens for _, _, _, tokens in results) / wall,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "ttft_p50_s": percentile(first_tokens, 50),
        "ttft_p99_s": percentile(first_tokens, 99),
        "first_text_p50_s": percentile(first_texts, 50),
        "first_text_p99_s": percentile(first_texts, 99),
    }


def fuzz(url: str, count: int) -> dict[int, int]:
    """`count` random or malformed bodies against both endpoints; status -> how many."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_serve import random_body  # the test suite's fuzz bodies, at a larger count

    rng = random.Random(count)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=url, timeout=600) as http:
        for _ in range(count):
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            body = random_body(rng).replace(b'"tiny"', f'"{MODEL}"'.encode())
            status = http.post(path, content=body, headers={"Content-Type": "application/json"}).status_code
            statuses[status] = statuses.get(status, 0) + 1
        assert http.get("/health").status_code == 200
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--dtype", choices=PRECISIONS, default="float32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--fuzz", type=int, default=0, help="also send this many random bodies (0: none)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llm = on_passing_thread(lambda: build_llm(args.dtype))  # as `gpt2 serve` loads (gpt2.serve.server)
    tokenizer = llm.tokenizer
    rng = random.Random(SEED)
    prompt_ids = [rng.randrange(256 if len(tokenizer) < 50000 else 50000) for _ in range(args.prompt_tokens)]
    prompt = tokenizer.decode(prompt_ids)
    print(
        f"GPT-2 124M shape, random weights, {args.dtype}, CPU, {args.threads} torch threads; prompt "
        f"{len(tokenizer.encode(prompt))} tokens, {args.max_tokens} new tokens, {args.requests} requests per client"
    )
    results: list[dict[str, Any]] = []
    print(
        f"{'clients':>7} {'mode':>14} {'req':>4} {'tokens/s':>9} {'p50 s':>7} {'p99 s':>7} {'ttft p50/p99 s':>15} "
        f"{'first text p50/p99 s':>21}"
    )
    for clients in args.clients:
        for mode, max_batch in (("batched", args.max_batch), ("one at a time", 1)):
            with running(llm, max_batch) as url:
                run_clients(url, 1, 1, prompt, 4)  # warm-up: first-call costs out of the figures
                row = {"clients": clients, "mode": mode, "max_batch": max_batch}
                row |= run_clients(url, clients, args.requests, prompt, args.max_tokens)
            results.append(row)
            print(
                f"{clients:>7} {mode:>14} {row['requests']:>4} {row['tokens_per_s']:>9.1f} "
                f"{row['latency_p50_s']:>7.2f} {row['latency_p99_s']:>7.2f} "
                f"{row['ttft_p50_s']:>7.2f} /{row['ttft_p99_s']:>6.2f} "
                f"{row['first_text_p50_s']:>13.2f} /{row['first_text_p99_s']:>6.2f}",
                flush=True,
            )
    if args.fuzz:
        with running(llm, args.max_batch) as url:
            statuses = fuzz(url, args.fuzz)
        server_errors = sum(count for status, count in statuses.items() if status >= 500)
        print(f"fuzz: {args.fuzz} bodies, statuses {dict(sorted(statuses.items()))}, 5xx: {server_errors}")
        results.append({"fuzz": args.fuzz, "statuses": statuses, "server_errors": server_errors})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
