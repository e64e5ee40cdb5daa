"""Which CPU decoding path to use by default: our native kernels against our PyTorch layouts, per precision.

The native kernels (gpt2.inference.kernels) have hand-vectorized AVX-512 paths and portable C++ loops for every
other CPU; the PyTorch layouts (gpt2.inference.layouts) use PyTorch's own kernels. `use_native_kernels` picks the
kernels by default only where the CPU has AVX-512; this benchmark is the measurement behind that rule. GPT-2 124M
shape with random weights, batch 1, greedy, `--threads` threads: decode tokens/s (the steps after the first new
token) and prompt tokens/s (a 256-token prefill), for the model prepared as `gpt2 sample --dtype X` does with
GPT2_NATIVE_KERNELS=1 (the kernels, whatever the CPU) and =0 (the PyTorch layouts), alternating in one process,
--repeats times each; the table takes each side's best.

    flock /tmp/bench.lock python benchmarks/bench_native_default.py --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import torch

from gpt2.config import GPTConfig
from gpt2.inference import prepare_for_inference
from gpt2.inference.kernels import SWITCH_VARIABLE, VECTOR_FLAGS, cpu_flags, kernels_available
from gpt2.model import GPT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu_decode import ours_decode, ours_prefill, prompt_ids  # noqa: E402

PRECISIONS = ["float32", "bfloat16", "int8", "int4"]
PATHS = {"native kernels": "1", "PyTorch layouts": "0"}


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
            for path, switch in PATHS.items():  # alternating: a change of machine load hits both alike
                os.environ[SWITCH_VARIABLE] = switch
                model = prepare_for_inference(copy.deepcopy(base), precision)
                decode = ours_decode(model, prompt_ids(32), args.new_tokens)
                prefill = ours_prefill(model, prompt_ids(256))
                old = best.get((precision, path), (0.0, 0.0))
                best[precision, path] = (max(old[0], decode), max(old[1], prefill))
                del model
    print("| precision | decode tok/s, kernels | decode tok/s, PyTorch layouts | kernels / layouts "
          "| prompt tok/s, kernels | prompt tok/s, layouts | kernels / layouts |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for precision in args.precisions:
        (nd, np_), (td, tp) = best[precision, "native kernels"], best[precision, "PyTorch layouts"]
        print(f"| {precision} | {nd:.1f} | {td:.1f} | {nd / td:.2f}x | {np_:.0f} | {tp:.0f} | {np_ / tp:.2f}x |")


if __name__ == "__main__":
    main()
