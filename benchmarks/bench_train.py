"""Training-step throughput: ours vs transformers' GPT2LMHeadModel, same shape, batch and AdamW settings.

A step is forward + backward + AdamW (weight decay on 2-D tensors, as gpt2.train builds it for both models).
Runs are interleaved (ours, theirs, ours, ...) so a machine shared with other work slows both alike; the
median over repeats is reported, with ours/theirs ratios. "ours+Trainer" is the whole `Trainer.train_step` that
`gpt2 train` runs (LR, micro-step, gradient clipping, AdamW, zero, sync) on the same batch, so the loop's cost
over the bare step shows. Also times AdamW alone (for-loop / foreach / fused).

    python benchmarks/bench_train.py                       # both shapes, fp32 and bf16 autocast
    python benchmarks/bench_train.py --shape small --repeats 20
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.runtime.device import autocast
from gpt2.train import Trainer, TrainingData, configure_optimizer
from gpt2.train.config import OptimizerConfig, TrainConfig

SHAPES = {
    # the shakespeare-char quality setup: 4 layers, 4 heads, width 128, block 64, batch 12, byte vocabulary
    "small": (GPTConfig(vocab_size=257, block_size=64, n_layer=4, n_head=4, n_embd=128), 12, 64),
    # GPT-2 124M at batch 4 x 256
    "124m": (GPTConfig(vocab_size=50257, block_size=1024), 4, 256),
}
CPU = torch.device("cpu")
DEFAULTS_HF = "transformers/float32 + torch default AdamW"


def hf_model(config: GPTConfig) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_config = GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd, n_layer=config.n_layer,
        n_head=config.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
    )  # fmt: skip
    return GPT2LMHeadModel(hf_config).train()


def make_step(model: torch.nn.Module, hf: bool, dtype: torch.dtype, impl: str) -> Callable[[torch.Tensor], dict]:
    optimizer = configure_optimizer(model, OptimizerConfig(impl=impl), CPU)

    def step(x: torch.Tensor) -> dict[str, float]:
        t0 = time.perf_counter()
        with autocast(CPU, dtype):
            loss = model(input_ids=x, labels=x).loss if hf else model(x[:, :-1], x[:, 1:]).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "adamw": t3 - t2, "step": t3 - t0}

    return step


class FixedBatch:
    """A batch source that returns the (x, y) of the sequences it was last given."""

    def __init__(self) -> None:
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def give(self, tokens: torch.Tensor) -> None:
        self.batch = (tokens[:, :-1], tokens[:, 1:])

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.batch is not None
        return self.batch

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def make_trainer_step(config: GPTConfig, dtype: torch.dtype, impl: str, out_dir: str) -> Callable[[torch.Tensor], dict]:
    """Trainer.train_step as `gpt2 train` runs it (metrics lines off: log_interval beyond the run)."""
    model = GPT(config).train()
    settings = TrainConfig.from_dict(dict(optimizer_impl=impl, dtype=str(dtype).removeprefix("torch."), device="cpu",
                           max_steps=10**6, log_interval=10**6, out_dir=out_dir))  # fmt: skip
    batches = FixedBatch()
    trainer = Trainer(model, configure_optimizer(model, settings.optimizer, CPU), settings, TrainingData(batches))

    def step(x: torch.Tensor) -> dict[str, float]:
        batches.give(x)
        return {"step": trainer.train_step().seconds}

    return step


def bench_shape(name: str, dtypes: list[torch.dtype], impl: str, repeats: int, warmup: int) -> list[dict]:
    config, B, T = SHAPES[name]
    torch.manual_seed(0)
    x = torch.randint(0, config.vocab_size, (B, T + 1))  # ours reads x[:, :-1] -> x[:, 1:]; HF shifts inside
    variants = {}
    out_dir = tempfile.mkdtemp(prefix="bench_train-")  # the Trainer's out_dir: nothing is written there
    for dtype in dtypes:
        label = str(dtype).removeprefix("torch.")
        variants[f"ours/{label}"] = make_step(GPT(config).train(), False, dtype, impl)
        variants[f"ours+Trainer/{label}"] = make_trainer_step(config, dtype, impl, out_dir)
        variants[f"transformers/{label}"] = make_step(hf_model(config), True, dtype, impl)
    # transformers as people run it on a CPU: fp32 and torch.optim.AdamW's default (the per-tensor loop on CPU)
    variants[DEFAULTS_HF] = make_step(hf_model(config), True, torch.float32, "for-loop")
    times: dict[str, list[dict]] = {key: [] for key in variants}
    for i in range(warmup + repeats):
        for key, step in variants.items():  # interleaved: a noisy neighbour hits every variant alike
            t = step(x[:, :T] if "transformers" in key else x)
            if i >= warmup:
                times[key].append(t)
    shutil.rmtree(out_dir)
    rows = []
    tokens = B * T
    for key, samples in times.items():
        median = {part: statistics.median(s[part] for s in samples) for part in samples[0]}
        rows.append({
            "shape": name, "variant": key, "optimizer": impl, "batch": f"{B}x{T}",
            "tokens_per_s": round(tokens / median["step"]),
            **{f"{part}_ms": round(1000 * value, 1) for part, value in median.items()},
        })  # fmt: skip
    for dtype in dtypes:
        label = str(dtype).removeprefix("torch.")
        ours = next(r for r in rows if r["variant"] == f"ours/{label}")
        theirs = next(r for r in rows if r["variant"] == f"transformers/{label}")
        ours["speedup_vs_transformers_same_dtype"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2)
        default = next(r for r in rows if r["variant"] == DEFAULTS_HF)
        ours["speedup_vs_transformers_fp32_default_adamw"] = round(ours["tokens_per_s"] / default["tokens_per_s"], 2)
        trainer = next(r for r in rows if r["variant"] == f"ours+Trainer/{label}")
        trainer["trainer_vs_bare_step"] = round(trainer["tokens_per_s"] / ours["tokens_per_s"], 3)
    return rows


def bench_adamw(name: str, repeats: int) -> list[dict]:
    """AdamW step time alone over the model's parameters, with random gradients."""
    config, _, _ = SHAPES[name]
    model = GPT(config)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizers = {impl: configure_optimizer(model, OptimizerConfig(impl=impl), CPU)
                  for impl in ("for-loop", "foreach", "fused")}  # fmt: skip
    times: dict[str, list[float]] = {impl: [] for impl in optimizers}
    for i in range(repeats + 1):
        for impl, optimizer in optimizers.items():
            t0 = time.perf_counter()
            optimizer.step()
            if i:
                times[impl].append(time.perf_counter() - t0)
    return [{"shape": name, "adamw": impl, "ms": round(1000 * statistics.median(t), 1)} for impl, t in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", choices=list(SHAPES), help="repeatable; default: all")
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16"], help="default: both")
    parser.add_argument("--optimizer", default="fused", choices=["for-loop", "foreach", "fused"])
    parser.add_argument("--repeats", type=int, default=None, help="default: 20 (small), 4 (124m)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = [getattr(torch, d) for d in (args.dtype or ["float32", "bfloat16"])]
    rows = []
    for name in args.shape or list(SHAPES):
        repeats = args.repeats or (20 if name == "small" else 4)
        for row in bench_shape(name, dtypes, args.optimizer, repeats, warmup=2 if name == "small" else 1):
            print(json.dumps(row), flush=True)
            rows.append(row)
        for row in bench_adamw(name, repeats):
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"threads: {torch.get_num_threads()}, torch {torch.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
