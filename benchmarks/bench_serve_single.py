"""One user of the server against the same model offline: what the server adds to a lone streamed request.

GPT-2 124M shape, random weights (seeded, no network) saved with save_pretrained next to the GPT-2 tokenizer
files, on CPU. In one run, interleaved round by round:

- offline: `LLM.stream` of that directory, loaded as `gpt2 serve` loads it (`LLM.load`, --dtype);
- offline + socket: the same, each text piece written as a server-sent event (a chunk shaped like the server's)
  to a loopback TCP connection that another process reads: what delivering every token costs on these cores,
  whatever serves it (int8 on the 2-core VM: 0.92-1.0 of offline, run to run; docs/benchmarks.md, stop 31);
- server: a real `gpt2 serve` process on a loopback port, one streamed /v1/completions request at a time (on
  uvloop and httptools, which the serve extra installs and uvicorn picks);
- server on asyncio + h11: the same server on uvicorn's pure-Python choices, asyncio's event loop and the h11
  parser (what it ran on before stop 32). Both servers run side by side; an idle one takes no CPU.

Both get the same prompts (--prompt-tokens random token ids, sent as ids; a new one each round, so that the
server's prefix cache reuses nothing), --max-tokens new tokens, seeded sampling (temperature 0.8, top-k 50) and
end-of-text biased away, so both generate exactly max_tokens tokens.

- time to first token: offline, a whole `LLM.stream` call with max_tokens=1 (the prefill and one draw); server,
  from sending the request to the first streamed chunk (every token has a chunk);
- decode tokens/s after the first token: offline, (max_tokens - 1) / (a full call's time - the time to first
  token); server, (max_tokens - 1) / (last token's chunk - first chunk).

Medians over --rounds; the order alternates round by round (A B C D, D C B A, ...). Reported: each, and server /
offline (decode speed ratio, time-to-first-token ratio), offline + socket / offline, and each contender's decode
speed over offline's in the same round (median of those ratios: the VM's memory speed changes within seconds, and
a round's contenders share its phase).

    flock /tmp/bench.lock python benchmarks/bench_serve_single.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

from common import SERVED_MODEL as MODEL
from common import gpt2_serve_command, save_random_gpt2, served
from gpt2.api import LLM
from gpt2.cpu.layouts import PRECISIONS
from gpt2.inference.sampling import SamplingParams

SEED = 0
END_OF_TEXT = 50256
NO_END_OF_TEXT = -100.0  # its logit bias: random weights could draw it, and every request must run max_tokens
TEMPERATURE, TOP_K = 0.8, 50


# `gpt2 serve` on asyncio's event loop and h11 whatever is installed (arguments: those of `gpt2`).
ASYNCIO_SERVER = """
import sys
import uvicorn
from gpt2.cli import main
make_config = uvicorn.Config.__init__
def on_asyncio(self, *args, **kwargs):
    make_config(self, *args, **{**kwargs, "loop": "asyncio", "http": "h11"})
uvicorn.Config.__init__ = on_asyncio
sys.exit(main(sys.argv[1:]))
"""


# The other end of "offline + socket": reads one connection's events and answers each [DONE] with a byte.
READER = """
import socket
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
connection, _ = listener.accept()
pending = b""
while data := connection.recv(65536):
    pending = (pending + data)[-16:]
    if pending.endswith(b"data: [DONE]\\n\\n"):
        connection.sendall(b"k")
"""


@contextmanager
def socket_reader() -> Iterator[socket.socket]:
    """A loopback TCP connection to a reading process of its own, as a streaming client would be."""
    process = subprocess.Popen([sys.executable, "-c", READER], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        with socket.create_connection(("127.0.0.1", int(process.stdout.readline()))) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the server's sockets
            yield connection
    finally:
        process.kill()
        process.wait()


def offline_seconds(llm: LLM, prompt: list[int], max_tokens: int, client: socket.socket | None = None) -> float:
    """Seconds of one whole `LLM.stream` call (every piece consumed). With a client socket, every piece is also
    sent there as a server-sent event like the server's chunks, and the call ends once the reader has them all."""
    params = SamplingParams(
        max_tokens=max_tokens, temperature=TEMPERATURE, top_k=TOP_K, seed=SEED, logit_bias={END_OF_TEXT: -100}
    )
    start = time.perf_counter()
    for piece in llm.stream(prompt, params):
        if client is not None:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
            chunk = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": MODEL, "choices": [choice]}
            client.sendall(f"data: {json.dumps(chunk)}\n\n".encode())
    if client is not None:
        client.sendall(b"data: [DONE]\n\n")
        client.recv(1)
    return time.perf_counter() - start


def offline_run(
    llm: LLM, prompt: list[int], max_tokens: int, client: socket.socket | None = None
) -> tuple[float, float]:
    """(time to first token, decode tokens/s after it) offline: a call for one token, then a whole one."""
    first = offline_seconds(llm, prompt, 1, client)
    return first, (max_tokens - 1) / (offline_seconds(llm, prompt, max_tokens, client) - first)


def served_run(url: str, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    """(time to first token, decode tokens/s after it) of one streamed request to the server at `url`."""
    times = served_times(url, prompt, max_tokens)
    return times[0], (max_tokens - 1) / (times[-1] - times[0])


def served_times(url: str, prompt: list[int], max_tokens: int) -> list[float]:
    """Seconds from sending one streamed completion to each token's chunk.

    HTTP/1.1 written and read on a plain socket, the events counted in the bytes as they arrive (no JSON parsed),
    as the socket reference's reader does: the client runs on the same cores as the server's decode, so its work
    per token is kept to a `recv` (httpx, used before stop 32, cost ~0.2 ms of CPU a token: 2-5% of int8 decoding
    on 2 cores went to the client)."""
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": TEMPERATURE,
            "top_k": TOP_K,
            "seed": SEED,
            "logit_bias": {str(END_OF_TEXT): NO_END_OF_TEXT},
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    times: list[float] = []
    received, pending = b"", b""  # the response's first bytes; an event not complete yet
    with socket.create_connection((address.hostname, address.port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        connection.sendall(head + body)
        while data := connection.recv(65536):
            now = time.perf_counter() - start
            received = received or data
            *events, pending = (pending + data).split(b"\n\n")  # (chunked framing sits between the events)
            times += [now for event in events if b"data: {" in event]
    if not received.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the server answered {received[:200]!r}")
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
        on_asyncio = [sys.executable, "-c", ASYNCIO_SERVER, *command[3:]]  # command: python -m gpt2.cli serve ...
        with (
            served(command, args.threads) as url,
            served(on_asyncio, args.threads) as asyncio_url,
            socket_reader() as client,
        ):
            contenders: dict[str, Callable[[list[int], int], tuple[float, float]]] = {
                "offline": lambda prompt, n: offline_run(llm, prompt, n),
                "offline + socket": lambda prompt, n: offline_run(llm, prompt, n, client),
                "server": lambda prompt, n: served_run(url, prompt, n),
                "asyncio + h11": lambda prompt, n: served_run(asyncio_url, prompt, n),
            }
            for run in contenders.values():  # warm-up: first-call costs out of the figures
                run(prompts[-1], 4)
            firsts: dict[str, list[float]] = {name: [] for name in contenders}
            rates: dict[str, list[float]] = {name: [] for name in contenders}
            for index, prompt in enumerate(prompts[: args.rounds]):
                for name in contenders if index % 2 == 0 else reversed(contenders):
                    first, rate = contenders[name](prompt, n)
                    firsts[name].append(first)
                    rates[name].append(rate)
    result: dict[str, Any] = {
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": n,
        "dtype": args.dtype,
        "threads": args.threads,
        "rounds": args.rounds,
        **{f"{name}_ttft_s": statistics.median(values) for name, values in firsts.items()},
        **{f"{name}_tokens_per_s": statistics.median(values) for name, values in rates.items()},
    }
    offline_rate, offline_first = result["offline_tokens_per_s"], result["offline_ttft_s"]
    result["decode_ratio"] = result["server_tokens_per_s"] / offline_rate
    result["ttft_ratio"] = result["server_ttft_s"] / offline_first
    result["socket_decode_ratio"] = result["offline + socket_tokens_per_s"] / offline_rate
    result["paired_decode_ratios"] = {
        name: statistics.median(rate / offline for rate, offline in zip(rates[name], rates["offline"], strict=True))
        for name in contenders
    }
    print(
        f"GPT-2 124M shape, random weights, {args.dtype}, CPU, {args.threads} torch threads; prompt "
        f"{args.prompt_tokens} tokens, {n} new tokens, median of {args.rounds} rounds"
    )
    print(f"{'':>16} {'ttft ms':>8} {'decode tok/s':>13} {'vs offline':>11} {'paired':>7}")
    for name in contenders:
        rate, first = result[f"{name}_tokens_per_s"], result[f"{name}_ttft_s"]
        paired = result["paired_decode_ratios"][name]
        print(f"{name:>16} {first * 1e3:>8.1f} {rate:>13.1f} {rate / offline_rate:>11.3f} {paired:>7.3f}")
    print(
        f"server / offline: decode speed {result['decode_ratio']:.3f}, time to first token {result['ttft_ratio']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
