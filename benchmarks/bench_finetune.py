"""Fine-tuning throughput and peak memory: ours (the Trainer step `gpt2 finetune` runs) vs transformers (a plain
loop: forward with labels, backward, clip, the same fused AdamW, zero), full fine-tuning and LoRA (ours vs PEFT),
GPT-2 124M shape, CPU, float32; plus ours as `gpt2 finetune` ships (dtype "auto": bf16 autocast on a CPU with
bf16 matmuls faster than fp32: AMX, or AVX512-BF16 on AMD; float32 elsewhere), against transformers as it
ships (float32).

Each case runs in its own process, so its peak resident memory (VmHWM) is its own; the figure reported is
the peak minus the resident memory after the model is loaded and before the first step (what training adds:
gradients, optimizer state, activations). Random weights of the 124M shape (made by transformers, loaded by
both), so no download is needed.

    flock /tmp/bench.lock python benchmarks/bench_finetune.py --steps 3 --batch-size 2 --block-size 128
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import peak_rss_mb

CASES = ("ours-full", "transformers-full", "ours-lora", "peft-lora", "ours-full-as-shipped", "ours-lora-as-shipped")
LORA_RANK, LORA_ALPHA = 8, 16.0


def rss_mib() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * resource.getpagesize() / 2**20


def run_case(case: str, model_dir: Path, steps: int, batch_size: int, block_size: int) -> dict[str, float]:
    torch.manual_seed(0)
    x = torch.randint(0, 50257, (batch_size, block_size))
    y = torch.randint(0, 50257, (batch_size, block_size))
    if case.startswith("ours"):
        from gpt2.finetune.data import RowBatches, Rows
        from gpt2.finetune.lora import LoRAConfig, add_lora
        from gpt2.train import Trainer, TrainingData, configure_optimizer
        from gpt2.train.config import TrainConfig
        from gpt2.weights import load_model

        model = load_model(model_dir).train()
        if case.startswith("ours-lora"):
            add_lora(model, LoRAConfig(rank=LORA_RANK, alpha=LORA_ALPHA, dropout=0.0))
        config = TrainConfig.from_dict(dict(tokenizer="bytes", block_size=block_size, batch_size=batch_size,
                                            max_steps=steps + 1, warmup_steps=1, weight_decay=0.0, eval_interval=0,
                                            device="cpu", dtype="auto" if case.endswith("as-shipped") else "float32",
                                            out_dir=tempfile.mkdtemp()))  # fmt: skip
        trainer = Trainer(model, configure_optimizer(model, config.optimizer, torch.device("cpu")), config,
                          TrainingData(RowBatches(Rows(x, y), batch_size)))  # fmt: skip
        step = trainer.train_step
    else:
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="sdpa").train()
        if case == "peft-lora":
            import peft

            lora = peft.LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=["c_attn"],
                                   fan_in_fan_out=True)  # fmt: skip
            model = peft.get_peft_model(model, lora)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0, fused=True)

        def step() -> None:
            loss = model(input_ids=x, labels=torch.cat([x[:, :1], y[:, :-1]], 1)).loss  # HF shifts labels itself
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    before = rss_mib()
    step()  # warm-up: allocates gradients and optimizer state
    started = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = time.perf_counter() - started
    return {"tokens_per_s": steps * batch_size * block_size / seconds, "added_peak_mib": peak_rss_mb() - before,
            "peak_rss_mib": peak_rss_mb()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, Path(args.model_dir), args.steps, args.batch_size, args.block_size)))
        return
    from transformers import GPT2Config, GPT2LMHeadModel

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(tmp)  # the 124M shape, random weights
        print(f"GPT-2 124M shape, CPU ({torch.get_num_threads()} threads), float32, batch {args.batch_size} x "
              f"{args.block_size}, {args.steps} timed steps after one warm-up step")  # fmt: skip
        print(f"{'case':<20}{'tokens/s':>10}{'added peak MiB':>16}{'peak RSS MiB':>14}")
        for case in CASES:
            command = [sys.executable, __file__, "--case", case, "--model-dir", tmp, "--steps", str(args.steps),
                       "--batch-size", str(args.batch_size), "--block-size", str(args.block_size)]  # fmt: skip
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            result = json.loads(output.strip().splitlines()[-1])
            print(f"{case:<20}{result['tokens_per_s']:>10.0f}{result['added_peak_mib']:>16.0f}"
                  f"{result['peak_rss_mib']:>14.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
