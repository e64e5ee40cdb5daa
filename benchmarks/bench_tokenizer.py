"""Tokenizer throughput and BPE training time (results go to docs/benchmarks.md, "## Tokenizer").

    python benchmarks/bench_tokenizer.py                      # ~1-2 minutes on 2 cores
    python benchmarks/bench_tokenizer.py --repeats 5 --skip-hf

Measures:
  * single-thread encode on three corpora (Python standard-library code, tinyshakespeare prose, a generated
    multilingual text): ours (gpt2.Tokenizer) vs tiktoken built from the same files with GPT-2's split
    pattern in both of tiktoken's spellings (the plain one and its registry's possessive one). The engines
    alternate, best of --repeats, so load from other processes on a shared machine hits all alike; the
    ratios are the figures to read. On tinyshakespeare x10 (11 MB) as one string also transformers'
    GPT2TokenizerFast (the HF `tokenizers` engine).
  * batch encode of the same text cut into paragraphs: 1 worker vs 2 workers (and tiktoken's own batch API).
  * training a byte-level BPE at vocab 8192 on 10 MB of Python standard-library source.
All tokenizers are checked to give the same ids before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sysconfig
import time
from pathlib import Path

from gpt2.tokenizer import load_tokenizer

SHARED_DATA = Path(os.environ.get("GPT2_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MB = 1e6
# GPT-2's split pattern as tiktoken spells it: plainly, and in its registry's r50k_base (possessive).
TIKTOKEN_PLAIN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TIKTOKEN_R50K = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
MULTILINGUAL = (
    "Ünïcödé façade — naïve café. Привет, как дела? Это тест 123. 你好，世界！这是一个测试。 こんにちは世界。"
    " مرحبا بالعالم 42. Γειά σου κόσμε! हिन्दी पाठ।  \t\n  x's we'll THEY'RE 3.14e10 \u00a0nbsp "
)


def best_time(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def stdlib_sample(limit_bytes: int) -> list[str]:
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
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bpe-dir", type=Path, default=SHARED_DATA / "gpt2-bpe")
    parser.add_argument("--corpus", type=Path, default=SHARED_DATA / "corpora" / "tinyshakespeare.txt")
    parser.add_argument("--copies", type=int, default=10, help="copies of the corpus in the encode text")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-mb", type=float, default=10.0)
    parser.add_argument("--train-vocab", type=int, default=8192)
    parser.add_argument("--skip-hf", action="store_true", help="skip the slow transformers measurement")
    args = parser.parse_args()

    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    from gpt2 import train_tokenizer

    text = args.corpus.read_text(encoding="utf-8") * args.copies
    size_mb = len(text.encode("utf-8")) / MB
    ours = load_tokenizer(args.bpe_dir)
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the local files, write no cache
    ranks = data_gym_to_mergeable_bpe_ranks(str(args.bpe_dir / "vocab.bpe"), str(args.bpe_dir / "encoder.json"))
    peers = {
        name: tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        for name, pattern in [("tiktoken_plain", TIKTOKEN_PLAIN), ("tiktoken_r50k", TIKTOKEN_R50K)]
    }
    ids = ours.encode(text)
    results: dict[str, object] = {
        "machine": f"{os.cpu_count()}-core {platform.machine()}",
        "load_average_1min_at_start": round(os.getloadavg()[0], 2),
        "text_mb": round(size_mb, 2),
        "tokens": len(ids),
    }

    # single thread on three kinds of text: alternate the engines so background load is shared fairly
    corpora = {
        "code": "".join(stdlib_sample(3_000_000)),
        "prose": args.corpus.read_text(encoding="utf-8") * 3,
        "multilingual": MULTILINGUAL * 8000,
    }
    for corpus_name, corpus in corpora.items():
        engines = {"ours": ours.encode, **{name: peer.encode_ordinary for name, peer in peers.items()}}
        expected = engines["ours"](corpus)
        assert all(encode(corpus) == expected for encode in engines.values()), f"ids disagree on {corpus_name}"
        best = dict.fromkeys(engines, float("inf"))
        for _ in range(args.repeats):
            for name, encode in engines.items():
                best[name] = min(best[name], best_time(lambda: encode(corpus), 1))  # noqa: B023
        corpus_mb = len(corpus.encode("utf-8")) / MB
        results[corpus_name] = {
            "mb": round(corpus_mb, 2),
            **{f"{name}_mb_s": round(corpus_mb / seconds, 2) for name, seconds in best.items()},
            **{f"ours_vs_{name}": round(best[name] / best["ours"], 3) for name in peers},
        }
    reference = peers["tiktoken_r50k"]

    if not args.skip_hf:
        from transformers import GPT2TokenizerFast

        hf_dir = args.bpe_dir
        hf = GPT2TokenizerFast(
            vocab=str(hf_dir / "encoder.json"),
            merges=str(hf_dir / "vocab.bpe"),
            split_special_tokens=True,
            model_max_length=10**12,
        )
        assert hf.encode("Hello world") == [15496, 995], "transformers built a broken tokenizer"
        started = time.perf_counter()
        hf_ids = hf.encode(text)
        hf_time = time.perf_counter() - started
        assert hf_ids == ids, "ours and transformers disagree"
        results["hf_fast_single_mb_s"] = round(size_mb / hf_time, 2)

    # batch: the same text as paragraphs (many short strings, the case tiktoken's one-task-per-string API is slow on)
    paragraphs = text.split("\n\n")
    one_times, two_times = [], []
    for _ in range(args.repeats):  # alternate, as above
        one_times.append(best_time(lambda: ours.encode_batch(paragraphs, num_threads=1), 1))
        two_times.append(best_time(lambda: ours.encode_batch(paragraphs, num_threads=2), 1))
    one, two = min(one_times), min(two_times)
    tiktoken_batch = best_time(lambda: reference.encode_ordinary_batch(paragraphs, num_threads=2), args.repeats)
    results.update(
        paragraphs=len(paragraphs),
        ours_batch_1_worker_mb_s=round(size_mb / one, 2),
        ours_batch_2_workers_mb_s=round(size_mb / two, 2),
        batch_2_vs_1=round(one / two, 3),
        tiktoken_batch_2_threads_mb_s=round(size_mb / tiktoken_batch, 2),
    )

    # batch of large pieces: what `gpt2 prepare` sends (the text cut into 256 KiB pieces at whitespace-free
    # boundaries is approximated here by paragraph groups of about that size)
    pieces, current, size = [], [], 0
    for paragraph in paragraphs:
        current.append(paragraph)
        size += len(paragraph) + 2
        if size >= 262_144:
            pieces.append("\n\n".join(current))
            current, size = [], 0
    pieces.append("\n\n".join(current))
    one_times, two_times = [], []
    for _ in range(args.repeats):
        one_times.append(best_time(lambda: ours.encode_batch(pieces, num_threads=1), 1))
        two_times.append(best_time(lambda: ours.encode_batch(pieces, num_threads=2), 1))
    results.update(
        pieces_256k=len(pieces),
        ours_pieces_1_worker_mb_s=round(size_mb / min(one_times), 2),
        ours_pieces_2_workers_mb_s=round(size_mb / min(two_times), 2),
        pieces_2_vs_1=round(min(one_times) / min(two_times), 3),
    )

    # training: 10 MB of Python source, the project's own use case
    sample = stdlib_sample(int(args.train_mb * MB))
    started = time.perf_counter()
    trained = train_tokenizer(sample, vocab_size=args.train_vocab)
    results["train_mb"] = round(sum(len(t.encode("utf-8")) for t in sample) / MB, 2)
    results["train_vocab"] = trained.vocab_size
    results["train_seconds"] = round(time.perf_counter() - started, 2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
