"""Which CPU decoding path to use by default: each build of our native kernels against our PyTorch layouts, per
precision.

The native kernels (gpt2.cpu.kernels) have one build per instruction set (AVX-512, AVX2, NEON, portable C++); the
PyTorch layouts (gpt2.cpu.layouts) use PyTorch's own kernels. `use_native_kernels` picks the best vector build this
CPU runs, and the PyTorch layouts only where it has none; this benchmark is the measurement behind that rule. GPT-2
124M shape with random weights, batch 1, greedy, `--threads` threads: decode tokens/s (the steps after the first new
token) and prompt tokens/s (a 256-token prefill), for the model prepared as `gpt2 sample --dtype X` does on each
build this CPU runs (GPT2_CPU_ISA) and on the layouts (GPT2_NATIVE_KERNELS=0), taking turns in one process,
--repeats times each; the table takes each one's best. To see the AVX2 build as an AVX2-only CPU runs the rest of
PyTorch too, cap PyTorch's and oneDNN's instruction sets in the same command:

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/inference/native_default.py --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import os

import torch

from gpt2.bench.decode import ours_decode, ours_prefill
from gpt2.bench.setup import prompt_ids
from gpt2.bench.timing import interleaved
from gpt2.config import GPTConfig
from gpt2.cpu import prepare_for_inference
from gpt2.cpu.kernels import ISA_VARIABLE, SWITCH_VARIABLE, kernels_available, runnable_isas
from gpt2.model import GPT

PRECISIONS = ["float32", "bfloat16", "int8", "int4"]
LAYOUTS = "layouts"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", default=PRECISIONS, choices=PRECISIONS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    builds = [isa for isa in runnable_isas() if kernels_available(isa)]
    print(f"threads={args.threads} builds={','.join(builds)} torch={torch.__version__}")
    torch.manual_seed(0)
    base = GPT(GPTConfig()).eval()

    def measure(path: str, precision: str) -> tuple[float, float]:
        os.environ.pop(SWITCH_VARIABLE, None)
        os.environ.pop(ISA_VARIABLE, None)
        if path == LAYOUTS:
            os.environ[SWITCH_VARIABLE] = "0"
        else:
            os.environ[ISA_VARIABLE] = path
        model = prepare_for_inference(copy.deepcopy(base), precision)  # prepared in place
        decode = ours_decode(model, prompt_ids(1, 32, 50257), args.new_tokens)
        return decode, ours_prefill(model, prompt_ids(1, 256, 50257))

    print("| precision | path | decode tok/s | vs layouts | prompt tok/s | vs layouts |")
    print("|---|---|---|---|---|---|")
    for precision in args.precisions:
        paths = [*builds, LAYOUTS]
        runs = interleaved(
            {path: lambda path=path, precision=precision: measure(path, precision) for path in paths},
            warmup=0,
            repetitions=args.repeats,
        )
        best = {path: (max(r[0] for r in results), max(r[1] for r in results)) for path, results in runs.items()}
        layout_decode, layout_prefill = best[LAYOUTS]
        for path in paths:
            decode, prefill = best[path]
            print(f"| {precision} | {path} | {decode:.1f} | {decode / layout_decode:.2f}x | {prefill:.0f} "
                  f"| {prefill / layout_prefill:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
