"""The GPU profile: one command that, in at most 10 minutes on one H100, measures what a GPU figure is wanted for.

- training the 124M shape: `Trainer.train_step` at batch 16 x 1024 tokens, bf16 autocast, torch.compile, with
  AdamW and with Muon: step time, tokens/s, MFU against `H100_BF16_DENSE_PEAK_FLOPS`;
- decoding at bfloat16, batch 1 and batch 64;
- the server (`gpt2 serve --dtype bfloat16 --max-batch 64`) under 64 clients.

Every record goes to a JSON-lines file as it is measured, so a run cut short keeps what it measured. `dry_run`
runs the same steps on a tiny model on the CPU in seconds (no compile), which the tests use to check the records.
"""

from __future__ import annotations

import dataclasses

from gpt2.bench.decode import DecodeGrid, run_decode
from gpt2.bench.record import Recorder
from gpt2.bench.serve import ServeLoad, run_serve
from gpt2.bench.setup import BenchSettings
from gpt2.bench.train import TrainGrid, run_train

H100_BF16_DENSE_PEAK_FLOPS = 989e12  # NVIDIA H100 SXM, bf16 tensor cores without sparsity (its datasheet)

GPU_TRAIN = TrainGrid(optimizers=("adamw", "muon"), batch_size=16, block_size=1024, dtype="bfloat16", compile=True,
                      peak_flops=H100_BF16_DENSE_PEAK_FLOPS)  # fmt: skip
GPU_DECODE = DecodeGrid(precisions=("bfloat16",), batch_sizes=(1, 64), prompt_tokens=32, new_tokens=128)
GPU_SERVE = ServeLoad(clients=(64,), requests=2, prompt_tokens=64, max_tokens=64, dtype="bfloat16", max_batch=64)

DRY_TRAIN = dataclasses.replace(GPU_TRAIN, batch_size=2, block_size=32, dtype="float32", compile=False)
DRY_DECODE = dataclasses.replace(GPU_DECODE, precisions=("float32",), batch_sizes=(1, 4), new_tokens=8)
DRY_SERVE = dataclasses.replace(GPU_SERVE, clients=(4,), requests=1, prompt_tokens=8, max_tokens=8,
                                dtype="float32", max_batch=4)  # fmt: skip


def run_gpu_profile(settings: BenchSettings, recorder: Recorder, *, dry_run: bool = False) -> None:
    """Train (AdamW, Muon), decode (batch 1, 64), serve (64 clients); dry_run: the same on a tiny CPU model."""
    if dry_run:
        settings = dataclasses.replace(settings, device="cpu", repetitions=1, warmup=1)
        train, decode, serve = DRY_TRAIN, DRY_DECODE, DRY_SERVE
    else:
        if settings.torch_device.type != "cuda":
            raise ValueError("the GPU profile needs a CUDA device (--device cuda); --dry-run runs it on the CPU")
        train, decode, serve = GPU_TRAIN, GPU_DECODE, GPU_SERVE
    # a compiled step's time settles after a few steps: at least 10 timed steps after 2 untimed ones
    steps = settings if dry_run else dataclasses.replace(settings, repetitions=max(settings.repetitions, 10),
                                                         warmup=max(settings.warmup, 2))  # fmt: skip
    run_train(steps, train, recorder)
    run_decode(settings, decode, recorder)
    run_serve(settings, serve, recorder)
