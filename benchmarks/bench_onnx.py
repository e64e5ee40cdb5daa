"""CPU decoding, ours against ONNX Runtime on the graph `gpt2 export --format onnx` writes, side by side in one run.

GPT-2 124M shape with random weights (no network), batch 1, greedy, --threads threads (default 2). Pairs: ours
float32 / ORT model.onnx (fp32), ours int8 / ORT model_quantized.onnx (ORT's quantize_dynamic, int8 weights). Ours
runs as `gpt2 sample --dtype X` does (`prepare_for_inference`, then the KV-cache `stream`); ORT runs the exported
decoder-with-past on its CPU execution provider, feeding each call's `present.*` back as `past_key_values.*`, as
transformers.js and Optimum do. Cases alternate ours / ORT, --repeats times each; the table takes each side's best.

Decode tokens/s counts the steps after the first new token (prompt of --prompt-tokens, --new-tokens new).

    flock /tmp/bench.lock python benchmarks/bench_onnx.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gpt2.config import GPTConfig
from gpt2.cpu import prepare_for_inference
from gpt2.export import export_onnx, onnx_input_names
from gpt2.model import GPT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu_decode import ours_decode, prompt_ids, tokenizer  # noqa: E402

SEED = 0
PAIRS = {"float32": "model.onnx", "int8": "model_quantized.onnx"}


def ort_session(path: Path, threads: int):  # noqa: ANN201 (onnxruntime is optional)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_decode(session, config: GPTConfig, prompt: list[int], new_tokens: int) -> float:  # noqa: ANN001
    """Tokens/s of the decode steps after the first new token, greedy, the cache carried between calls."""
    past_names = onnx_input_names(config.n_layer)[3:]
    shape = (1, config.n_head, 0, config.head_dim)
    past = {name: np.zeros(shape, np.float32) for name in past_names}
    ids = np.array([prompt], dtype=np.int64)
    length, start, count = 0, 0.0, 0
    for step in range(new_tokens):
        if step == 1:
            start = time.perf_counter()
        T = ids.shape[1]
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones((1, length + T), np.int64),
            "position_ids": np.arange(length, length + T, dtype=np.int64)[None],
            **past,
        }
        logits, *present = session.run(None, feed)
        past = dict(zip(past_names, present, strict=True))
        length += T
        ids = logits[:, -1].argmax(-1, keepdims=True).astype(np.int64)
        count += step >= 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(SEED)
    reference = GPT(GPTConfig.from_name("gpt2")).eval()
    prompt = prompt_ids(args.prompt_tokens)
    with tempfile.TemporaryDirectory(prefix="bench_onnx_") as folder:
        start = time.perf_counter()
        export_onnx(reference, tokenizer(), Path(folder) / "onnx-out", dtype="int8")
        print(f"export (fp32 trace + int8 quantization): {time.perf_counter() - start:.0f} s")
        print(f"GPT-2 124M shape, random weights, batch 1, {args.threads} threads, greedy, prompt {len(prompt)}")
        print("| precision | ours tok/s | ONNX Runtime tok/s | ours / ORT |")
        print("|---|---|---|---|")
        for precision in args.precisions:
            model = prepare_for_inference(_copy(reference), precision)  # it packs the layers in place
            session = ort_session(Path(folder) / "onnx-out" / "onnx" / PAIRS[precision], args.threads)
            ours_decode(model, prompt, 8)  # warm-up
            ort_decode(session, reference.config, prompt, 8)
            ours, theirs = [], []
            for _ in range(args.repeats):
                ours.append(ours_decode(model, prompt, args.new_tokens))
                theirs.append(ort_decode(session, reference.config, prompt, args.new_tokens))
            print(f"| {precision} | {max(ours):.1f} | {max(theirs):.1f} | {max(ours) / max(theirs):.2f} |")


def _copy(model: GPT) -> GPT:
    """The same weights in a model of their own."""
    copy = GPT(model.config).eval()
    copy.load_state_dict(model.state_dict())
    return copy


if __name__ == "__main__":
    main()
