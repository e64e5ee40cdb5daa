"""CPU decoding, ours against llama.cpp, side by side in one run, per precision.

GPT-2 124M shape with random weights (no network), batch 1, greedy, --threads threads (default 2). Pairs: ours
float32 / llama.cpp f32, bfloat16 / bf16, int8 / q8_0, int4 / q4_0. Ours runs as `gpt2 sample --dtype X` does
(`prepare_for_inference` then the KV-cache `stream`: the native kernels where they build, else the PyTorch
layouts; `GPT2_NATIVE_KERNELS=0` forces the latter); llama.cpp runs through llama-cpp-python on the GGUF `gpt2
export` writes from the same weights (q4_0: llama.cpp's own quantizer applied to our f32 file). Cases alternate
ours / theirs, --repeats times each; the table takes each side's best.

Per case: decode tokens/s (the steps after the first new token, prompt of --prompt-tokens, --new-tokens new),
prompt processing tokens/s (one --pp-tokens prompt into the cache, logits of its last position only, as both
generate), and decode tokens/s at position ~1000 (long context). For ours also the share of the read-bandwidth
limit: bytes one decode step reads / median read bandwidth (the sum of a 512 MiB tensor, as
benchmarks/bench_generate.py measures it).

llama.cpp runs in a child process per case: on one machine its AMX weight-repacking path has crashed (q8_0), so a
case is tried with repacking (its default) and, if the child dies, again without (--no-repack); the table says
which. Needs llama_cpp (see benchmarks/bench_llamacpp.py for the install).

    flock /tmp/bench.lock python benchmarks/bench_cpu_decode.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt2.config import GPTConfig
from gpt2.cpu import prepare_for_inference
from gpt2.export import export_gguf
from gpt2.inference import SamplingParams, stream
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer, load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights import load_model, save_pretrained

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import bytes_per_step, read_bandwidth  # noqa: E402

SEED = 0
PAIRS = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0", "int4": "q4_0"}
LLAMA_FTYPE_MOSTLY_Q4_0 = 2  # llama.h's enum llama_ftype
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def tokenizer() -> TextTokenizer:
    bpe = SHARED_DATA / "gpt2-bpe"
    return load_tokenizer(bpe) if (bpe / "encoder.json").exists() else ByteTokenizer()


def prompt_ids(length: int, vocab: int = 50000) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(SEED)).tolist()


# ------------------------------------------------------------------------------------ ours
@torch.no_grad()
def ours_decode(model: GPT, prompt: list[int], new_tokens: int) -> float:
    """Tokens/s of the decode steps after the first new token (the first one comes with the prefill)."""
    tokens = stream(model, torch.tensor([prompt]), SamplingParams(max_tokens=new_tokens, temperature=0))
    next(tokens)
    start = time.perf_counter()
    count = sum(1 for _ in tokens)
    return count / (time.perf_counter() - start)


@torch.no_grad()
def ours_prefill(model: GPT, prompt: list[int]) -> float:
    """Prompt tokens/s of a prefill as generation runs it: the cache filled, the next token's logits (as
    llama.cpp computes only the last position's logits)."""
    cache = model.new_kv_cache(1, max_len=len(prompt))
    start = time.perf_counter()
    hidden = model.hidden_states(torch.tensor([prompt]), kv_cache=cache, validate=False)
    model.lm_head(hidden[:, -1])
    return len(prompt) / (time.perf_counter() - start)


# ------------------------------------------------------------------------------------ llama.cpp (child process)
def llamacpp_case(path: str, threads: int, repack: bool, args: argparse.Namespace) -> dict[str, float]:
    """Runs in the child: the same three measurements with llama.cpp, greedy (argmax of its logits)."""
    import llama_cpp

    if not repack:
        default_params = llama_cpp.llama_cpp.llama_model_default_params

        def without_repacking():  # llama.cpp's --no-repack
            params = default_params()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_cpp.llama_model_default_params = without_repacking
    # n_batch = n_ctx: llama-cpp-python keeps n_batch rows of logits when logits_all is off
    llama = llama_cpp.Llama(
        model_path=path, n_ctx=1024, n_batch=1024, n_threads=threads, n_threads_batch=threads, verbose=False
    )

    def decode(prompt: list[int], new_tokens: int) -> float:
        llama.reset()
        llama.eval(prompt)
        token = int(np.argmax(llama.scores[llama.n_tokens - 1]))
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            llama.eval([token])
            token = int(np.argmax(llama.scores[llama.n_tokens - 1]))
        return (new_tokens - 1) / (time.perf_counter() - start)

    def prefill(prompt: list[int]) -> float:
        llama.reset()
        start = time.perf_counter()
        llama.eval(prompt)
        return len(prompt) / (time.perf_counter() - start)

    decode(prompt_ids(args.prompt_tokens), 8)  # warm-up
    return {
        "decode": decode(prompt_ids(args.prompt_tokens), args.new_tokens),
        "prefill": prefill(prompt_ids(args.pp_tokens)),
        "decode_long": decode(prompt_ids(args.long_context), args.long_new_tokens),
    }


def run_llamacpp(path: Path, args: argparse.Namespace, repack: bool) -> dict[str, Any] | None:
    command = [sys.executable, __file__, "--child", str(path), "--threads", str(args.threads)]
    command += ["--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens)]
    command += ["--pp-tokens", str(args.pp_tokens), "--long-context", str(args.long_context)]
    command += ["--long-new-tokens", str(args.long_new_tokens)] + ([] if repack else ["--no-repack"])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def quantize_q4_0(source: Path, target: Path) -> None:
    """llama.cpp's own quantizer (llama_model_quantize), as its llama-quantize tool runs it."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q4_0
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params) != 0:
        raise RuntimeError("llama.cpp could not quantize the f32 file to q4_0")


# ------------------------------------------------------------------------------------ the run
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--pp-tokens", type=int, default=512)
    parser.add_argument("--long-context", type=int, default=960)
    parser.add_argument("--long-new-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-repack", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(llamacpp_case(args.child, args.threads, not args.no_repack, args)))
        return

    with tempfile.TemporaryDirectory(prefix="bench_cpu_decode_") as folder:
        run(args, Path(folder))


def run(args: argparse.Namespace, folder: Path) -> None:
    """Export the files into `folder`, then run every case."""
    torch.manual_seed(SEED)
    reference = GPT(GPTConfig.from_name("gpt2")).eval()
    save_pretrained(reference, folder / "hf")
    text_tokenizer = tokenizer()
    files = {}
    for precision in args.precisions:
        name = PAIRS[precision]
        path = folder / f"gpt2-{name}.gguf"
        if name == "q4_0":
            quantize_q4_0(export_gguf(reference, text_tokenizer, folder / "gpt2-f32.gguf", dtype="f32"), path)
        else:
            export_gguf(reference, text_tokenizer, path, dtype=name)
        files[precision] = path
    bandwidths: list[float] = []
    results: dict[str, dict[str, Any]] = {}
    print(f"GPT-2 124M shape, random weights, batch 1, {args.threads} threads, greedy; llama_cpp in child processes")
    for precision in args.precisions:
        model = prepare_for_inference(load_model(folder / "hf"), precision)
        ours_decode(model, prompt_ids(args.prompt_tokens), 8)  # warm-up
        row: dict[str, Any] = {"ours": [], "theirs": [], "repack": None}
        for _ in range(args.repeats):
            bandwidths.append(read_bandwidth())
            ours = {
                "decode": ours_decode(model, prompt_ids(args.prompt_tokens), args.new_tokens),
                "prefill": ours_prefill(model, prompt_ids(args.pp_tokens)),
                "decode_long": ours_decode(model, prompt_ids(args.long_context), args.long_new_tokens),
            }
            theirs = None
            for repack in (True, False) if row["repack"] is None else (row["repack"],):
                theirs = run_llamacpp(files[precision], args, repack)
                if theirs is not None:
                    row["repack"] = repack
                    break
            row["ours"].append(ours)
            row["theirs"].append(theirs)
            print(f"{precision:8s} ours {fmt(ours)} | llama.cpp {PAIRS[precision]} {fmt(theirs)}", flush=True)
        row["step_bytes"] = bytes_per_step(model, 1, args.prompt_tokens + args.new_tokens // 2)
        results[precision] = row
        del model

    bandwidth = statistics.median(bandwidths)
    print(f"\nread bandwidth (median of {len(bandwidths)}): {bandwidth / 1e9:.1f} GB/s")
    print("\n| ours / llama.cpp | decode tokens/s | ratio | prompt tokens/s | ratio | decode at ~1000 | ratio "
          "| ours: MB/step, of bandwidth limit | llama.cpp repack |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for precision, row in results.items():
        cells = []
        for key in ("decode", "prefill", "decode_long"):
            ours_best = max(run[key] for run in row["ours"])
            theirs_runs = [run[key] for run in row["theirs"] if run]
            theirs_best = max(theirs_runs) if theirs_runs else float("nan")
            cells += [f"{ours_best:.1f} / {theirs_best:.1f}", f"**{ours_best / theirs_best:.2f}x**"]
        limit = bandwidth / row["step_bytes"]
        share = max(run["decode"] for run in row["ours"]) / limit
        repack = {True: "yes", False: "no (crashed with it)", None: "failed"}[row["repack"]]
        print(
            f"| {precision} / {PAIRS[precision]} | {' | '.join(cells)} | {row['step_bytes'] / 1e6:.0f}, {share:.0%} "
            f"| {repack} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"bandwidth": bandwidth, "results": results}, indent=2))


def fmt(run: dict[str, float] | None) -> str:
    if run is None:
        return "crashed"
    return f"decode {run['decode']:6.1f}  prefill {run['prefill']:7.1f}  decode@long {run['decode_long']:6.1f}"


if __name__ == "__main__":
    main()
