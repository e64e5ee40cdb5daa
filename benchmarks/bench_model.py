"""Training-step speed and peak memory of the model, ours vs transformers' GPT2LMHeadModel, side by side.

Each measurement runs in its own process (peak RSS is per process), ours and theirs interleaved, so machine
noise hits both alike; the ratio is the figure. A step is forward + backward + AdamW (torch's default
implementation for both), on random tokens, in float32 unless --dtype bf16 (autocast).

    python benchmarks/bench_model.py                      # 124M shape, batch 4 x 256, CPU
    python benchmarks/bench_model.py --device cuda --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

GIB = 1024**3


def child(impl: str, args: argparse.Namespace) -> dict:
    import torch

    torch.manual_seed(0)
    device = torch.device(args.device)
    if impl == "ours":
        from gpt2 import GPT, GPTConfig

        model = GPT(GPTConfig.from_name(args.preset)).to(device)
        step_loss = lambda x, y: model(x, targets=y).loss  # noqa: E731
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        from gpt2 import GPTConfig

        c = GPTConfig.from_name(args.preset)
        hf_config = GPT2Config(
            n_layer=c.n_layer,
            n_head=c.n_head,
            n_embd=c.n_embd,
            n_positions=c.block_size,
            vocab_size=c.vocab_size,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        model = GPT2LMHeadModel(hf_config).to(device)
        # HF shifts labels itself: give it the T+1 window so both see T predictions per row.
        step_loss = lambda x, y: model(torch.cat([x, y[:, -1:]], 1)[:, :-1], labels=x).loss  # noqa: E731
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    B, T = args.batch, args.seq
    x = torch.randint(0, 50257, (B, T), device=device)
    y = torch.randint(0, 50257, (B, T), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def step() -> None:
        with autocast:
            loss = step_loss(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / args.steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    result = {"impl": impl, "step_s": seconds, "tokens_per_s": B * T / seconds, "peak_rss_gib": peak / GIB}
    if device.type == "cuda":
        result["peak_cuda_gib"] = torch.cuda.max_memory_allocated() / GIB
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved ours/theirs process pairs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return

    results: dict[str, list[dict]] = {"ours": [], "hf": []}
    passthrough = [a for a in sys.argv[1:]]
    for _ in range(args.repeats):
        for impl in ("ours", "hf"):
            out = subprocess.run(
                [sys.executable, __file__, *passthrough, "--child", impl], check=True, capture_output=True, text=True
            )
            results[impl].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[impl][-1]), flush=True)
    summary = {
        impl: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "impl"} for impl, rs in results.items()
    }
    ratio = summary["ours"]["tokens_per_s"] / summary["hf"]["tokens_per_s"]
    print(f"\n{args.preset} batch {args.batch}x{args.seq} {args.device} {args.dtype}, median of {args.repeats}:")
    for impl, s in summary.items():
        print(
            f"  {impl:5s} {s['tokens_per_s']:9.1f} tokens/s  step {s['step_s']:.3f} s"
            f"  peak RSS {s['peak_rss_gib']:.2f} GiB"
            + (f"  peak CUDA {s['peak_cuda_gib']:.2f} GiB" if "peak_cuda_gib" in s else "")
        )
    print(f"  speed ratio ours/transformers: {ratio:.2f}x")


if __name__ == "__main__":
    main()
