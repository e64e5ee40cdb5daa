"""`gpt2 serve` side by side with llama.cpp's llama-server: concurrent clients, and a chat of many turns.

The same random GPT-2 124M (seeded, no network), saved in HF layout with the GPT-2 tokenizer; llama-server gets it
as llama.cpp's own converter (convert_hf_to_gguf.py of the same source tree) writes it, at f32 and q8_0; ours
serves the directory at float32 and int8. Both servers run as processes of their own with the same threads and
16 sequences at once (ours: --max-batch 16; llama-server: 16 slots over one unified KV cache of 16 x 1024
tokens, its default f16 KV cache, flash attention auto, continuous batching). Both run side by side (an idle one
takes no CPU), fresh each round, and are loaded one at a time.

Load: C clients (--clients, default 1, 4, 16, 64) each send --requests streamed /v1/completions one after the
other; every request has its own --prompt-tokens random token ids (sent as ids: identical prompts for both
servers, and no prefix cache can reuse one), greedy, end-of-text biased away, --max-tokens new tokens (checked
through the usage both report). Per server and C: aggregate completion tokens/s (all tokens / wall time), time to
first token p50 / p99 (sending to the first streamed chunk with a token; a request waiting for a free slot counts
its wait). Rounds alternate which server goes first; the table shows each cell's median over the rounds. At one
client the requests alternate one by one between the servers (--single-requests each, A B B A ...): this VM's
memory speed changes within seconds (one process decoding float32 at 76 tokens/s, then 138 a second later), so a
1-client cell of a few requests run one server after the other measured the VM's phase more than the servers.

Chat: one client, --chat-turns turns; turn k's prompt is turn k-1's prompt + a 48-token reply + a 30-token user
message after a 40-token system prompt (fixed random ids, the same for every server, so each server reuses at most
the previous prompt), 48 new tokens per turn; time to first token per turn, median over --rounds chats with
different ids. Ours is also run with --no-prefix-cache for reference.

Build llama-server from llama-cpp-python's source (no network beyond PyPI):

    pip download --no-deps --no-binary :all: llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
    cd llama_cpp_python-*/vendor/llama.cpp && cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \\
        -DBUILD_SHARED_LIBS=OFF && cmake --build build -j2 --target llama-server
    flock /tmp/bench.lock python benchmarks/bench_serve_llama.py --llama-cpp PATH/vendor/llama.cpp
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from common import SERVED_MODEL, gpt2_serve_command, percentile, save_random_gpt2, served

END_OF_TEXT = 50256
# ours at a dtype, and the GGUF type of the same precision for llama.cpp
PRECISIONS = {"float32": "f32", "int8": "q8_0"}
SYSTEM_TOKENS, USER_TOKENS, REPLY_TOKENS = 40, 30, 48
CONTEXT_PER_SLOT = 1024


def convert(llama_cpp: Path, directory: Path, outtype: str, output: Path) -> None:
    """llama.cpp's own converter, from the same source tree as the server."""
    command = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(directory)]
    subprocess.run([*command, "--outtype", outtype, "--outfile", str(output)], check=True, capture_output=True)


def llama_server_command(llama_cpp: Path, gguf: Path, slots: int, threads: int) -> list[str]:
    binary = llama_cpp / "build" / "bin" / "llama-server"
    command = [str(binary), "-m", str(gguf), "-np", str(slots), "-kvu", "-c", str(slots * CONTEXT_PER_SLOT)]
    return command + ["-t", str(threads), "-tb", str(threads), "--no-webui", "--alias", SERVED_MODEL]


def connect(url: str) -> httpx.Client:
    """A client that opens a connection per request: llama-server (cpp-httplib) closes a kept-alive connection after
    a streamed response, which httpx finds only when it reuses it; both servers get the same treatment."""
    return httpx.Client(base_url=url, timeout=3600, limits=httpx.Limits(max_keepalive_connections=0))


def streamed(http: httpx.Client, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    """(seconds to the first chunk with a token, to the end) of one greedy streamed completion.

    Events are split in the raw bytes and only the usage event is parsed: the client shares the 2 cores with the
    server, so its work per token is kept small and the same for both servers."""
    body = {
        "model": SERVED_MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logit_bias": {str(END_OF_TEXT): -100},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    tokens = 0
    pending = b""
    with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for data in response.iter_raw():
            *events, pending = (pending + data).split(b"\n\n")
            for event in events:
                if b'"usage":{' in event or b'"usage": {' in event:
                    tokens = json.loads(event[len(b"data: ") :])["usage"]["completion_tokens"]
                elif first is None and event.startswith(b"data: {") and b'"choices":[{' in event.replace(b" ", b""):
                    first = time.perf_counter() - start
    end = time.perf_counter() - start
    if tokens != max_tokens:
        raise RuntimeError(f"{http.base_url} generated {tokens} tokens, expected {max_tokens}")
    return (first if first is not None else end), end


def load(url: str, clients: int, requests: int, prompt_tokens: int, max_tokens: int, seed: str) -> dict[str, Any]:
    """C clients, each sending `requests` streamed completions one after the other: completion tokens, wall time
    and each request's time to first token (`cell` makes a table's row of one or more of these)."""

    def client(index: int) -> list[tuple[float, float]]:
        rng = random.Random(f"load {seed} {clients} {index}")  # prompts no other request has
        with connect(url) as http:
            return [
                streamed(http, [rng.randrange(50000) for _ in range(prompt_tokens)], max_tokens)
                for _ in range(requests)
            ]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [item for part in pool.map(client, range(clients)) for item in part]
    wall = time.perf_counter() - start
    return {"tokens": len(results) * max_tokens, "wall_s": wall, "first_s": [first for first, _ in results]}


def cell(pieces: list[dict[str, Any]]) -> dict[str, float]:
    """One server's row of a table cell from its pieces of load: all tokens / all their wall time, and the time to
    first token p50 / p99 over all their requests."""
    first_tokens = [first for piece in pieces for first in piece["first_s"]]
    return {
        "tokens_per_s": sum(piece["tokens"] for piece in pieces) / sum(piece["wall_s"] for piece in pieces),
        "ttft_p50_s": percentile(first_tokens, 50),
        "ttft_p99_s": percentile(first_tokens, 99),
    }


def chat(url: str, turns: int, seed: int) -> list[float]:
    """Time to first token of each turn of one conversation (token ids, see the module's docstring)."""
    rng = random.Random(f"chat {seed}")

    def ids(count: int) -> list[int]:
        return [rng.randrange(50000) for _ in range(count)]

    prompt = ids(SYSTEM_TOKENS)
    firsts = []
    with connect(url) as http:
        for turn in range(turns):
            prompt += (ids(REPLY_TOKENS) if turn else []) + ids(USER_TOKENS)
            firsts.append(streamed(http, prompt, REPLY_TOKENS)[0])
    return firsts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree with build/bin")
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    parser.add_argument(
        "--single-requests", type=int, default=8, help="requests at 1 client, alternating between the servers"
    )
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--chat-turns", type=int, default=10, help="0: no chat")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--server-log", type=Path, default=Path(tempfile.gettempdir()) / "bench_serve_llama.log")
    args = parser.parse_args()
    args.server_log.unlink(missing_ok=True)

    results: dict[str, Any] = {"load": [], "chat": []}
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder) / "model"
        save_random_gpt2(directory)
        servers: dict[str, dict[str, list[str]]] = {}
        for dtype, outtype in PRECISIONS.items():
            if dtype in args.precisions:
                gguf = Path(folder) / f"model-{outtype}.gguf"
                convert(args.llama_cpp, directory, outtype, gguf)
                servers[dtype] = {
                    "ours": gpt2_serve_command(directory, dtype, "--max-batch", str(args.slots)),
                    "llama-server": llama_server_command(args.llama_cpp, gguf, args.slots, args.threads),
                }
        print(
            f"GPT-2 124M shape, random weights, CPU, {args.threads} threads, {args.slots} sequences at once; load: "
            f"{args.prompt_tokens}-token prompts, {args.max_tokens} greedy tokens, {args.requests} requests per "
            f"client ({args.single_requests} alternating at 1 client); medians of {args.rounds} rounds",
            flush=True,
        )
        for round_ in range(args.rounds):
            for dtype, commands in servers.items():
                names = list(commands) if round_ % 2 == 0 else list(reversed(commands))
                with contextlib.ExitStack() as stack:
                    urls = {
                        name: stack.enter_context(served(commands[name], args.threads, args.server_log))
                        for name in names
                    }
                    for name in names:
                        warm(urls[name], args.prompt_tokens)
                    for clients in args.clients:
                        # at 1 client request by request, in the order A B B A A B ...; under load a cell each
                        slices, requests = (args.single_requests, 1) if clients == 1 else (1, args.requests)
                        pieces: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
                        for index in range(slices):
                            for name in names if index % 2 == 0 else names[::-1]:
                                seed = f"{round_} {index}"
                                pieces[name].append(
                                    load(urls[name], clients, requests, args.prompt_tokens, args.max_tokens, seed)
                                )
                        for name in names:
                            results["load"].append(
                                {"dtype": dtype, "server": name, "clients": clients} | cell(pieces[name])
                            )
                    if args.chat_turns:
                        for name in names:
                            firsts = chat(urls[name], args.chat_turns, round_)
                            results["chat"].append({"dtype": dtype, "server": name, "ttft_s": firsts})
                print(f"round {round_ + 1}, {dtype}: done", flush=True)
            if args.chat_turns and "float32" in servers:
                no_cache = [*servers["float32"]["ours"], "--no-prefix-cache"]
                with served(no_cache, args.threads, args.server_log) as url:
                    warm(url, args.prompt_tokens)
                    firsts = chat(url, args.chat_turns, round_)
                results["chat"].append({"dtype": "float32", "server": "ours, no prefix cache", "ttft_s": firsts})
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def warm(url: str, prompt_tokens: int) -> None:
    """First-call costs out of the figures: a short prompt, and one of the measured length (a server's first prompt
    of a length pays once for it: oneDNN builds its kernels for each new shape, ~4-20 ms on this CPU)."""
    with connect(url) as http:
        for length in sorted({16, prompt_tokens}):
            streamed(http, list(range(100, 100 + length)), 4)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    def median_of(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    def cells(dtype: str, clients: int, key: str) -> tuple[float, float]:
        pick: Callable[[str], list[dict[str, Any]]] = lambda name: [  # noqa: E731
            row
            for row in results["load"]
            if row["dtype"] == dtype and row["server"] == name and row["clients"] == clients
        ]
        return median_of(pick("ours"), key), median_of(pick("llama-server"), key)

    print(
        f"\n{'dtype':>8} {'clients':>7} {'tokens/s ours / llama':>22} {'ratio':>6} "
        f"{'ttft p50 ms ours / llama':>25} {'ttft p99 ms ours / llama':>25}"
    )
    for dtype in dict.fromkeys(row["dtype"] for row in results["load"]):
        for clients in args.clients:
            ours, theirs = cells(dtype, clients, "tokens_per_s")
            p50 = cells(dtype, clients, "ttft_p50_s")
            p99 = cells(dtype, clients, "ttft_p99_s")
            print(
                f"{dtype:>8} {clients:>7} {ours:>10.1f} / {theirs:>9.1f} {ours / theirs:>6.2f} "
                f"{p50[0] * 1e3:>11.0f} / {p50[1] * 1e3:>11.0f} {p99[0] * 1e3:>11.0f} / {p99[1] * 1e3:>11.0f}"
            )
    if results["chat"]:
        print(f"\nchat, time to first token per turn (ms), median of {args.rounds} chats")
        for key in dict.fromkeys((row["dtype"], row["server"]) for row in results["chat"]):
            rows = [row["ttft_s"] for row in results["chat"] if (row["dtype"], row["server"]) == key]
            per_turn = [statistics.median(turn) * 1e3 for turn in zip(*rows, strict=True)]
            turns = " ".join(f"{value:.0f}" for value in per_turn)
            print(f"{key[0]:>8} {key[1]:>22}: {turns}  (last / first {per_turn[-1] / per_turn[0]:.2f})")


if __name__ == "__main__":
    main()
