"""Which CPU decoding path to use by default: our native kernels against our PyTorch layouts, per precision.

The native kernels (gpt2.cpu.kernels) have hand-vectorized AVX-512 paths and portable C++ loops for every
other CPU; the PyTorch layouts (gpt2.cpu.layouts) use PyTorch's own kernels. `use_native_kernels` picks the
kernels by default only where the CPU has AVX-512; this benchmark is the measurement behind that rule. GPT-2 124M
shape with random weights, batch 1, greedy, `--threads` threads: decode tokens/s (the steps after the first new
token) and prompt tokens/s (a 256-token prefill), for the model prepared as `gpt2 sample --dtype X` does with
GPT2_NATIVE_KERNELS=1 (the kernels, whatever the CPU) and =0 (the PyTorch layouts, int8 / int4 activations in
`layout_dtype()`: float32 unless the CPU multiplies bfloat16 fast), and for int8 / int4 also the PyTorch layouts
with bfloat16 activations (their former default), alternating in one process, --repeats times each; the table
takes each one's best.

    flock /tmp/bench.lock python benchmarks/inference/native_default.py --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import os

import torch

import gpt2.cpu.layouts as layouts
from gpt2.bench.decode import ours_decode, ours_prefill
from gpt2.bench.setup import prompt_ids
from gpt2.config import GPTConfig
from gpt2.cpu import prepare_for_inference
from gpt2.cpu.kernels import SWITCH_VARIABLE, VECTOR_FLAGS, cpu_flags, kernels_available
from gpt2.model import GPT

PRECISIONS = ["float32", "bfloat16", "int8", "int4"]
# name: (GPT2_NATIVE_KERNELS, the int8 / int4 layouts' activation dtype or None for layout_dtype()'s)
PATHS: dict[str, tuple[str, torch.dtype | None]] = {
    "kernels": ("1", None),
    "layouts": ("0", None),
    "layouts, bf16": ("0", torch.bfloat16),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", default=PRECISIONS, choices=PRECISIONS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not kernels_available():
        raise SystemExit("the native kernels do not build here: nothing to compare")
    has_vector_paths = cpu_flags().issuperset(VECTOR_FLAGS)
    print(f"threads={args.threads} AVX-512 paths={has_vector_paths} torch={torch.__version__}")
    torch.manual_seed(0)
    base = GPT(GPTConfig()).eval()
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for precision in args.precisions:
        for _ in range(args.repeats):
            for path, (switch, dtype) in PATHS.items():  # alternating: a change of machine load hits all alike
                if dtype is not None and precision not in ("int8", "int4"):
                    continue
                os.environ[SWITCH_VARIABLE] = switch
                model = copy.deepcopy(base)  # prepared in place
                if dtype is None:
                    prepare_for_inference(model, precision)
                else:  # what prepare_for_inference did for the layouts before layout_dtype
                    quantize = layouts.quantize_int8 if precision == "int8" else layouts.quantize_int4
                    quantize(model, dtype=dtype)
                decode = ours_decode(model, prompt_ids(1, 32, 50257), args.new_tokens)
                prefill = ours_prefill(model, prompt_ids(1, 256, 50257))
                old = best.get((precision, path), (0.0, 0.0))
                best[precision, path] = (max(old[0], decode), max(old[1], prefill))
                del model
    print(f"layouts' int8 / int4 activations here: {layouts.layout_dtype()}")
    print("| precision | path | decode tok/s | vs layouts | prompt tok/s | vs layouts |")
    print("|---|---|---|---|---|---|")
    for precision in args.precisions:
        layout_decode, layout_prefill = best[precision, "layouts"]
        for path in PATHS:
            if (precision, path) in best:
                decode, prefill = best[precision, path]
                print(f"| {precision} | {path} | {decode:.1f} | {decode / layout_decode:.2f}x | {prefill:.0f} "
                      f"| {prefill / layout_prefill:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
