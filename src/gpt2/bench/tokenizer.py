"""Tokenizer throughput: our BPE encoder against tiktoken built from the same vocabulary and merges (opt-in), and
the time to train a byte-level BPE.

Text: a file you name, or the first few MB of the Python standard library's source (always there, no download).
Single-thread encode of the whole text as one string, and batch encode of its paragraphs over 2 workers; ours and
tiktoken alternate and must give the same ids before anything counts.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt2.bench.record import Recorder
from gpt2.bench.setup import BenchSettings, bench_tokenizer
from gpt2.bench.timing import interleaved, timed
from gpt2.tokenizer.bpe import SPECIAL_TOKEN_SHAPE, Tokenizer

MB = 1e6
OURS, TIKTOKEN = "ours", "tiktoken"  # the engines' names; the peer's is its records' peer
# GPT-2's split pattern as tiktoken's registry spells it (r50k_base)
TIKTOKEN_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


@dataclass(frozen=True)
class TokenizerWork:
    text: Path | None = None
    """The text to encode; None: `text_mb` MB of the Python standard library's source."""
    text_mb: float = 3.0
    peers: tuple[str, ...] = ()
    train_vocab: int = 0
    """Also train a byte-level BPE of this vocabulary on the text (0: no)."""

    def __post_init__(self) -> None:
        if any(peer != "tiktoken" for peer in self.peers):
            raise ValueError(f"tokenizer peers: tiktoken only, got {', '.join(self.peers)}")
        if self.text is not None and not Path(self.text).is_file():
            raise FileNotFoundError(f"no text file at {self.text}")


def stdlib_text(limit_bytes: int) -> str:
    """The first `limit_bytes` of the standard library's .py files (sorted), site-packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text.encode("utf-8"))
        if total >= limit_bytes:
            break
    return "".join(texts)


def tiktoken_peer(tokenizer: Tokenizer) -> Any:
    """tiktoken's Encoding over our vocabulary and merges (ranks = ids), GPT-2's split pattern."""
    import tiktoken

    os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")  # read nothing from its cache, write none
    ranks = {tokenizer.decode_bytes([i]): i for symbol, i in tokenizer.vocab.items()
             if not SPECIAL_TOKEN_SHAPE.fullmatch(symbol)}  # fmt: skip
    return tiktoken.Encoding("gpt2-bench", pat_str=TIKTOKEN_PATTERN, mergeable_ranks=ranks, special_tokens={})


def rate_of(encode: Callable[[], object], megabytes: float) -> Callable[[], float]:
    """A function giving the MB/s of one call of `encode`, which encodes `megabytes` of text."""
    return lambda: megabytes / timed(encode)


def run_tokenizer(settings: BenchSettings, work: TokenizerWork, recorder: Recorder) -> None:
    """`gpt2 bench tokenizer`: encode MB/s single-thread and batched, and BPE training time."""
    tokenizer = bench_tokenizer(settings)
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError("gpt2 bench tokenizer measures the BPE tokenizer; pass --tokenizer DIR (not bytes)")
    text = Path(work.text).read_text(encoding="utf-8") if work.text else stdlib_text(int(work.text_mb * MB))
    size = len(text.encode("utf-8")) / MB
    paragraphs = text.split("\n\n")
    ours: dict[str, Callable[[], object]] = {
        "encode MB/s (1 thread)": lambda: tokenizer.encode(text),
        "batch encode MB/s (2 workers)": lambda: tokenizer.encode_batch(paragraphs, num_threads=2),
    }
    theirs: dict[str, Callable[[], object]] = {}
    if "tiktoken" in work.peers:
        peer = tiktoken_peer(tokenizer)
        if peer.encode_ordinary(text) != tokenizer.encode(text):
            raise RuntimeError("tiktoken and ours disagree on the text's ids; the comparison would be meaningless")
        theirs = {
            "encode MB/s (1 thread)": lambda: peer.encode_ordinary(text),
            "batch encode MB/s (2 workers)": lambda: peer.encode_ordinary_batch(paragraphs, num_threads=2),
        }
    params = {"text": str(work.text) if work.text else f"Python stdlib source, {size:.1f} MB", "tokens":
              len(tokenizer.encode(text)), "tokenizer": settings.tokenizer or "gpt2"}  # fmt: skip
    for name, encode in ours.items():
        engines = {OURS: encode} | ({TIKTOKEN: theirs[name]} if theirs else {})
        rates = interleaved({engine: rate_of(run, size) for engine, run in engines.items()},
                            warmup=settings.warmup, repetitions=settings.repetitions)  # fmt: skip
        recorder.add("tokenizer", name, params, rates[OURS], "MB/s", (TIKTOKEN, rates[TIKTOKEN]) if theirs else None)
    if work.train_vocab:
        from gpt2.tokenizer import train_tokenizer

        seconds = [timed(lambda: train_tokenizer([text], vocab_size=work.train_vocab))]
        recorder.add("tokenizer", "BPE training", params | {"vocab": work.train_vocab}, seconds, "s")
