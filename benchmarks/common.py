"""What several benchmark scripts share (they run as `python benchmarks/NAME.py`, so this folder is on sys.path)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import torch

SHARED_DATA = Path(os.environ.get("GPT2_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SERVED_MODEL = "gpt2-124m-random"


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: VmHWM of its own memory map (Linux). Not ru_maxrss, which also
    counts the parent's memory the child ran in between fork and exec."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: the best there is


def save_random_gpt2(directory: Path, seed: int = 0) -> None:
    """A random 124M-shape GPT-2 (HF layout) and the GPT-2 tokenizer, as `gpt2 serve --model directory` reads them."""
    from gpt2.config import GPTConfig
    from gpt2.model import GPT
    from gpt2.tokenizer import load_tokenizer
    from gpt2.weights import save_pretrained

    bpe = SHARED_DATA / "gpt2-bpe"
    if not (bpe / "encoder.json").exists():
        raise FileNotFoundError(f"no GPT-2 tokenizer files in {bpe}; set GPT2_SHARED_DATA to the shared data folder")
    torch.manual_seed(seed)
    save_pretrained(GPT(GPTConfig.from_name("gpt2")), directory)
    load_tokenizer(bpe).save(directory)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpt2_serve_command(directory: Path, dtype: str, *flags: str) -> list[str]:
    """`gpt2 serve` of the model directory at a dtype; the port is added by `served`."""
    command = [sys.executable, "-m", "gpt2.cli", "serve", "--model", str(directory), "--dtype", dtype]
    return command + ["--served-model-name", SERVED_MODEL, "--log-level", "warning", *flags]


@contextmanager
def served(command: list[str], threads: int, log: Path | None = None) -> Iterator[str]:
    """A server command (taking `--port N`) in a process of its own; yields its URL once /health answers 200.
    Its output goes to `log` when given."""
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    output = open(log, "ab") if log else None  # noqa: SIM115 (closed below, after the process)
    process = subprocess.Popen([*command, "--port", str(port)], env=env, stdout=output, stderr=output)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{Path(command[0]).name} exited with status {process.returncode}")
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{Path(command[0]).name} did not answer within 300 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(60)
        if output:
            output.close()


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default) of the values."""
    values = sorted(values)
    position = (len(values) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)
