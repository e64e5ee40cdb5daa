"""Beam search (4 beams) tokens/s: ours vs transformers' generate, side by side in one alternating run.

    flock /tmp/bench.lock python benchmarks/bench_beam.py [--new-tokens 64] [--repeats 3]

The GPT-2 124M shape with random weights (seeded), saved once and loaded by both, float32, batch 1, a 32-token
prompt. Ours as `gpt2 sample --num-beams 4 --temperature 0 --dtype float32` runs it (prepare_for_inference: the
native decode step where it is built); transformers' GPT2LMHeadModel.generate(num_beams=4, do_sample=False).
tokens/s = new tokens of the best beam / seconds; both return the same beams (checked, printed).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from gpt2.config import GPTConfig
from gpt2.cpu import prepare_for_inference
from gpt2.cpu.kernels import kernels_available
from gpt2.inference.beam import beam_search
from gpt2.inference.prompt import DecodeOptions
from gpt2.inference.sampling import SamplingParams
from gpt2.model import GPT
from gpt2.weights import load_model, save_pretrained

SEED = 0
EOS = 50256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--native", choices=["auto", "off"], default="auto", help="off: the PyTorch decode step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import GPT2LMHeadModel

    torch.manual_seed(SEED)
    with tempfile.TemporaryDirectory() as directory:
        save_pretrained(GPT(GPTConfig.from_name("gpt2")).eval(), directory)
        ours = prepare_for_inference(load_model(directory), "float32")
        theirs = GPT2LMHeadModel.from_pretrained(directory).eval()
    idx = torch.randint(0, EOS, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(SEED))
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, num_beams=args.beams, stop_token_ids=[EOS])
    options = DecodeOptions(native=None if args.native == "auto" else False)

    def run_ours() -> torch.Tensor:
        return beam_search(ours, idx, params, options=options).sequences

    def run_theirs() -> torch.Tensor:
        with torch.no_grad():
            return theirs.generate(
                idx, attention_mask=torch.ones_like(idx), do_sample=False, num_beams=args.beams,
                max_new_tokens=args.new_tokens, pad_token_id=EOS, eos_token_id=EOS,
            )  # fmt: skip

    variants = {"ours fp32": run_ours, "transformers fp32": run_theirs}
    outputs = {name: fn() for name, fn in variants.items()}  # warm-up, and the beams to compare
    same = torch.equal(outputs["ours fp32"], outputs["transformers fp32"])
    new_tokens = outputs["ours fp32"].size(1) - args.prompt_tokens
    print(f"threads={args.threads} beams={args.beams} prompt={args.prompt_tokens} new={new_tokens} "
          f"native kernels={kernels_available()} native step={args.native} "
          f"same beams as transformers={same}")  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            rates[name].append(new_tokens / (time.perf_counter() - start))
            print(f"repeat {repeat}: {name:18s} {rates[name][-1]:7.1f} tokens/s", flush=True)
    ratios = [a / b for a, b in zip(rates["ours fp32"], rates["transformers fp32"], strict=True)]
    print("\n| variant | tokens/s (median of runs) | runs |")
    print("|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    print(f"\nours / transformers per repeat: {', '.join(f'{r:.2f}x' for r in ratios)} "
          f"(median {statistics.median(ratios):.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
