"""A request whose grammar takes seconds to compile, beside short requests: the short ones' latency while it
compiles against their latency alone (the server compiles grammars on worker threads, gpt2.serve.grammar).

One `gpt2 serve` (a process of its own, the 124M shape with random weights, float32); the slow request asks for a
JSON schema of objects nested --depth deep (xgrammar compiles it for seconds; past --grammar-timeout the request is
answered 400, either way a worker thread is busy with it meanwhile). Short requests: greedy 5-token completions
of an 8-token prompt, one after the other, --requests of them alone, then as many while the deep schema compiles
(each checked to finish before the schema's request does). Medians and the p90.

    flock /tmp/bench.lock python benchmarks/serve/grammar_stall.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from gpt2.bench.serve import SERVED_MODEL, ServeLoad, connect, served, server_commands
from gpt2.bench.setup import BenchSettings

SHARED_TOKENIZER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gpt2-bpe"


def deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for level in range(depth):
        schema = {"type": "object", "properties": {f"k{level}": schema}, "required": [f"k{level}"]}
    return schema


def short_latencies(http: httpx.Client, count: int, health: bool = False) -> list[float]:
    body = {"model": SERVED_MODEL, "prompt": list(range(100, 108)), "max_tokens": 5, "temperature": 0}
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        if health:
            http.get("/health").raise_for_status()
        else:
            http.post("/v1/completions", json=body).raise_for_status()
        seconds.append(time.perf_counter() - start)
    return seconds


def summary(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(seconds) * 1000:7.1f} ms, p90 {p90 * 1000:7.1f} ms (n={len(seconds)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=300)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--grammar-timeout", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = BenchSettings(tokenizer=str(SHARED_TOKENIZER))
    with tempfile.TemporaryDirectory() as folder:
        command = server_commands(settings, ServeLoad(clients=(1,)), Path(folder))["ours"]
        command += ["--grammar-timeout", str(args.grammar_timeout), "--threads", str(args.threads)]
        with served(command, Path(folder) / "server.log") as (url, _), connect(url) as http:
            short_latencies(http, 3)  # warm-up
            alone = short_latencies(http, args.requests)
            health_alone = short_latencies(http, args.requests, health=True)
            outcome: dict[str, Any] = {}

            def slow() -> None:
                schema = {"name": "deep", "schema": deep_schema(args.depth)}
                body = {"model": SERVED_MODEL, "prompt": "{", "max_tokens": 5,
                        "response_format": {"type": "json_schema", "json_schema": schema}}  # fmt: skip
                start = time.perf_counter()
                with connect(url) as other:
                    outcome["status"] = other.post("/v1/completions", json=body).status_code
                outcome["seconds"] = time.perf_counter() - start

            compiling = threading.Thread(target=slow)
            compiling.start()
            time.sleep(0.5)  # the schema's request is in, its compilation running
            beside = short_latencies(http, args.requests)
            health_beside = short_latencies(http, args.requests, health=True)
            finished_first = compiling.is_alive()
            compiling.join()
    print(
        f"{args.depth}-deep schema: answered {outcome['status']} after {outcome['seconds']:.1f} s "
        f"(--grammar-timeout {args.grammar_timeout:g}); the short requests done before it: {finished_first}"
    )
    ratio = statistics.median(beside) / statistics.median(alone)
    print(f"5-token request alone:        {summary(alone)}")
    print(f"5-token request beside it:    {summary(beside)}  ({ratio:.2f}x)")
    print(f"/health alone:                {summary(health_alone)}")
    print(f"/health beside it:            {summary(health_beside)}")


if __name__ == "__main__":
    main()
