"""The server under concurrent clients: `gpt2 serve` (started here, or any running one by URL) and, opt-in,
llama.cpp's llama-server on the same weights (the GGUF `gpt2 export --format gguf` writes), in the same run.

Load: C clients each send `requests` streamed /v1/completions one after the other; every request has its own
random prompt of `prompt_tokens` ids (sent as ids, so both servers see the same tokens and no prefix cache can
reuse one), greedy, end-of-text biased away, `max_tokens` new tokens (checked against the usage both report).
Per server and C: completion tokens/s over the wall time, time to first token (TTFT: sending to the first chunk
with a token; a request waiting for a free row counts its wait), inter-token latency (ITL: between chunks of one
request) and request latency, p50 and p99. Both servers run side by side (an idle one takes no CPU) with the same
threads and the same number of sequences at once.

With `adapters` (N LoRA adapters of rank `adapter_rank` on c_attn, random, PEFT's format), one `gpt2 serve` is
measured two ways in the same run: the C clients spread over the N adapters (client i asks for adapter i mod N in
`model`, so every batch mixes them), against the same clients asking for the base model alone. The adapters are
loaded through POST /v1/load_lora_adapter once the server runs, and the server process's resident memory before
and after gives the memory each adds, beside the size of its weights.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from gpt2.bench.record import Recorder, percentile
from gpt2.bench.setup import (
    END_OF_TEXT,
    BenchSettings,
    bench_model,
    bench_tokenizer,
    save_model_directory,
    write_adapters,
)
from gpt2.bench.timing import interleaved
from gpt2.cpu.layouts import PRECISIONS

SERVED_MODEL = "gpt2-bench"
CONTEXT_PER_SLOT = 1024
STARTUP_SECONDS = 300
ADAPTERS, BASE_ALONE = "adapters", "base model alone"  # the loads `--adapters` compares; the second is the peer
# ours at a dtype -> the GGUF type of the same precision for llama-server
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0"}
SERVED_DTYPES = PRECISIONS  # what `gpt2 serve --dtype` takes


@dataclass(frozen=True)
class ServeLoad:
    """What `gpt2 bench serve` sends."""

    clients: tuple[int, ...] = (1, 4, 16, 64)
    requests: int = 2
    """Requests per client, one after the other."""
    prompt_tokens: int = 64
    max_tokens: int = 64
    dtype: str = "float32"
    max_batch: int = 16
    """Sequences at once: ours --max-batch, llama-server's slots (-np)."""
    url: str | None = None
    """A running server to measure instead of starting `gpt2 serve`."""
    llama_server: Path | None = None
    adapters: int = 0
    """LoRA adapters to spread the clients over, against the base model alone (module docstring); 0: none."""
    adapter_rank: int = 8

    def __post_init__(self) -> None:
        if min(self.clients, default=0) < 1 or self.requests < 1:
            raise ValueError("--clients and --requests must be at least 1")
        if self.max_tokens < 2 or self.prompt_tokens < 1 or self.max_batch < 1:
            raise ValueError("--max-tokens must be at least 2 (the inter-token gaps need two), --prompt-tokens and "
                             "--max-batch at least 1")  # fmt: skip
        if self.dtype not in SERVED_DTYPES:
            raise ValueError(f"--dtype {self.dtype!r} is not one of {', '.join(SERVED_DTYPES)}")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url {self.url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000")
        if self.adapters < 0 or self.adapter_rank < 1:
            raise ValueError("adapters must be 0 or more and adapter_rank at least 1")
        if self.adapters and (self.url is not None or self.llama_server is not None):
            raise ValueError("--adapters measures our server with adapters against its base model alone; "
                             "leave out --url and --llama-server")  # fmt: skip
        if self.llama_server is not None and not Path(self.llama_server).is_file():
            raise FileNotFoundError(f"no llama-server binary at {self.llama_server}; build llama.cpp, pass its path")
        if self.llama_server is not None and self.dtype not in GGUF_TYPES:
            raise ValueError(f"llama-server pairs with dtype {', '.join(GGUF_TYPES)}, not {self.dtype!r}")


@dataclass
class Timings:
    """One request: seconds to the first token, the gaps between its chunks, to the end; completion tokens."""

    first: float
    gaps: list[float]
    end: float
    tokens: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def served(command: list[str], log: Path) -> Iterator[tuple[str, int]]:
    """A server command (taking `--port N`) in a process of its own; yields its URL and process id once /health
    answers 200."""
    port = free_port()
    with open(log, "ab") as output:
        process = subprocess.Popen([*command, "--port", str(port)], stdout=output, stderr=output)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            while not healthy(url):
                if process.poll() is not None:
                    raise RuntimeError(f"{Path(command[0]).name} exited with status {process.returncode}; see {log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{Path(command[0]).name} did not answer within {STARTUP_SECONDS} s; see {log}")
                time.sleep(0.2)
            yield url, process.pid
        finally:
            process.terminate()
            process.wait(60)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health").status_code == 200
    except httpx.TransportError:
        return False


def streamed(http: httpx.Client, prompt: list[int], max_tokens: int, model: str = SERVED_MODEL) -> Timings:
    """One greedy streamed completion. Events are split in the raw bytes and only the usage event is parsed: the
    client shares the cores with the server, so its work per token is kept small and the same for every server."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "logit_bias": {str(END_OF_TEXT): -100}, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    start = time.perf_counter()
    stamps: list[float] = []
    tokens, pending = 0, b""
    with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for data in response.iter_raw():
            *events, pending = (pending + data).split(b"\n\n")
            for event in events:
                if b'"usage":{' in event.replace(b" ", b""):
                    tokens = json.loads(event[len(b"data: ") :])["usage"]["completion_tokens"]
                elif event.startswith(b"data: {") and b'"choices":[{' in event.replace(b" ", b""):
                    stamps.append(time.perf_counter() - start)
    end = time.perf_counter() - start
    if tokens != max_tokens:
        raise RuntimeError(f"{http.base_url} generated {tokens} tokens, expected {max_tokens}")
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False)]
    return Timings(stamps[0] if stamps else end, gaps, end, tokens)


def connect(url: str) -> httpx.Client:
    """A connection per request: llama-server closes a kept-alive connection after a streamed response."""
    return httpx.Client(base_url=url, timeout=3600, limits=httpx.Limits(max_keepalive_connections=0))


def run_load(
    url: str, clients: int, load: ServeLoad, seed: str, models: tuple[str, ...] = (SERVED_MODEL,)
) -> dict[str, float]:
    """C clients, each sending load.requests completions one after the other (client i asks for models[i mod
    len(models)]): tokens/s and percentiles."""

    def client(index: int) -> list[Timings]:
        rng = random.Random(f"{seed} {clients} {index}")  # prompts no other request has
        model = models[index % len(models)]
        with connect(url) as http:
            prompts = [[rng.randrange(END_OF_TEXT) for _ in range(load.prompt_tokens)] for _ in range(load.requests)]
            return [streamed(http, prompt, load.max_tokens, model) for prompt in prompts]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [item for part in pool.map(client, range(clients)) for item in part]
    wall = time.perf_counter() - start
    firsts = [r.first for r in results]
    gaps = [gap for r in results for gap in r.gaps] or [0.0]
    ends = [r.end for r in results]
    return {
        "tokens/s": sum(r.tokens for r in results) / wall,
        "ttft p50": percentile(firsts, 50), "ttft p99": percentile(firsts, 99),
        "itl p50": percentile(gaps, 50), "itl p99": percentile(gaps, 99),
        "latency p50": percentile(ends, 50), "latency p99": percentile(ends, 99),
    }  # fmt: skip


def load_runner(
    url: str, clients: int, load: ServeLoad, models: tuple[str, ...] = (SERVED_MODEL,)
) -> Callable[[], dict[str, float]]:
    """`run_load` as a function of no arguments whose n-th call is seeded n: in one repetition every server (or
    model) gets the same prompts, and each repetition new ones."""
    seeds = itertools.count()
    return lambda: run_load(url, clients, load, str(next(seeds)), models)


def warm(url: str, load: ServeLoad, model: str = SERVED_MODEL) -> None:
    """First-call costs out of the figures: one short prompt and one of the measured length."""
    with connect(url) as http:
        for length in sorted({16, load.prompt_tokens}):
            streamed(http, list(range(100, 100 + length)), 4, model)


def server_commands(settings: BenchSettings, load: ServeLoad, folder: Path) -> dict[str, list[str]]:
    """The commands that start each server to measure (ours unless load.url is given, llama-server if asked)."""
    commands: dict[str, list[str]] = {}
    directory = None
    if load.url is None or load.llama_server is not None:
        directory = save_model_directory(settings, folder / "model")
    threads = str(torch.get_num_threads())
    if load.url is None:
        assert directory is not None
        commands["ours"] = [sys.executable, "-m", "gpt2.cli", "serve", "--model", str(directory), "--dtype",
                            load.dtype, "--device", settings.device, "--max-batch", str(load.max_batch),
                            "--served-model-name", SERVED_MODEL, "--log-level", "warning"]  # fmt: skip
        if load.adapters:
            commands["ours"].append("--allow-runtime-lora-updating")
    if load.llama_server is not None:
        from gpt2.export import export_gguf

        gguf = export_gguf(bench_model(settings), bench_tokenizer(settings), folder / "model.gguf",
                           dtype=GGUF_TYPES[load.dtype])  # fmt: skip
        commands["llama-server"] = [str(load.llama_server), "-m", str(gguf), "-np", str(load.max_batch), "-kvu",
                                    "-c", str(load.max_batch * CONTEXT_PER_SLOT), "-t", threads, "-tb", threads,
                                    "--no-webui", "--alias", SERVED_MODEL]  # fmt: skip
    return commands


def run_serve(settings: BenchSettings, load: ServeLoad, recorder: Recorder) -> None:
    """`gpt2 bench serve`: each client count, ours against llama-server where given; repetitions alternate which
    server goes first."""
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    if load.adapters:
        run_adapters(settings, load, recorder)
        return
    with tempfile.TemporaryDirectory(prefix="gpt2-bench-serve-") as folder, contextlib.ExitStack() as stack:
        commands = server_commands(settings, load, Path(folder))
        log = Path(folder) / "servers.log"
        urls = {name: stack.enter_context(served(command, log))[0] for name, command in commands.items()}
        if load.url is not None:
            if not healthy(load.url.rstrip("/")):
                raise ValueError(f"--url {load.url}: no server answers /health there; start `gpt2 serve` first")
            urls = {"ours": load.url.rstrip("/"), **urls}
        for url in urls.values():
            for _ in range(settings.warmup):
                warm(url, load)
        for clients in load.clients:
            loads = {name: load_runner(url, clients, load) for name, url in urls.items()}
            runs = interleaved(loads, warmup=0, repetitions=settings.repetitions)  # warmed once above, by warm()
            record_cell(recorder, runs["ours"], ("llama-server", runs.get("llama-server")), cell_params(clients,
                        settings, load))  # fmt: skip


def run_adapters(settings: BenchSettings, load: ServeLoad, recorder: Recorder) -> None:
    """`gpt2 bench serve --adapters N`: one server, its memory per adapter loaded at run time, then each client
    count spread over the adapters against the base model alone (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="gpt2-bench-serve-") as folder:
        commands = server_commands(settings, load, Path(folder))
        adapters = write_adapters(Path(folder) / "model", Path(folder), load.adapters, load.adapter_rank)
        names = tuple(f"adapter{index}" for index in range(load.adapters))
        with served(commands["ours"], Path(folder) / "servers.log") as (url, pid), connect(url) as http:
            before = resident_mib(pid)
            for name, path in zip(names, adapters, strict=True):
                http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}).raise_for_status()
            added = (resident_mib(pid) - before) / load.adapters
            weights = sum(path.stat().st_size for path in adapters[0].glob("*.safetensors")) / 2**20
            params = {"adapters": load.adapters, "rank": load.adapter_rank, "targets": "c_attn",
                      **settings.model_params()}  # fmt: skip
            recorder.add("serve", "added memory per adapter", params, [added], "MiB", ("its weights", [weights]))
            for _ in range(settings.warmup):
                warm(url, load)
                warm(url, load, names[0])
            for clients in load.clients:
                loads = {ADAPTERS: load_runner(url, clients, load, names), BASE_ALONE: load_runner(url, clients, load)}
                runs = interleaved(loads, warmup=0, repetitions=settings.repetitions)  # warmed once above
                cell = {**cell_params(clients, settings, load), "adapters": load.adapters, "rank": load.adapter_rank}
                record_cell(recorder, runs[ADAPTERS], (BASE_ALONE, runs[BASE_ALONE]), cell)


def resident_mib(pid: int) -> float:
    """A process's resident memory (Linux's /proc/PID/status VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


def cell_params(clients: int, settings: BenchSettings, load: ServeLoad) -> dict[str, Any]:
    return {"clients": clients, "dtype": load.dtype, "max_batch": load.max_batch, "prompt_tokens": load.prompt_tokens,
            "max_tokens": load.max_tokens, "requests_per_client": load.requests, **settings.model_params()}  # fmt: skip


def record_cell(
    recorder: Recorder,
    ours: list[dict[str, float]],
    peer: tuple[str, list[dict[str, float]] | None],
    params: dict[str, Any],
) -> None:
    """One client count's figures: ours against the peer's runs (none: ours alone)."""
    peer_name, peer_runs = peer
    for key in ("tokens/s", "ttft p50", "ttft p99", "itl p50", "itl p99", "latency p50"):
        scale, unit = (1.0, "tokens/s") if key == "tokens/s" else (1000.0, "ms")
        values = [run[key] * scale for run in ours]
        paired = (peer_name, [run[key] * scale for run in peer_runs]) if peer_runs else None
        recorder.add("serve", key, params, values, unit, paired)
