"""Training steps: ours as `gpt2 train` runs them (`Trainer.train_step`: LR, micro-step under autocast, clip,
optimizer step, zero, device sync), against nanoGPT's own model.py (opt-in, by path) on the same shape, batch and
settings.

Per optimizer: step time, tokens/s and, where the device's bf16 peak is known (`gpt2.train.peak_flops`), MFU:
training FLOPs per token (`gpt2.train.flops_per_token`, PaLM's count, as nanoGPT's `estimate_mfu`) x tokens/s / peak.
Optionally the time to a target training loss on a text file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt2.bench.record import Recorder
from gpt2.bench.setup import SEED, BenchSettings, bench_model, bench_tokenizer
from gpt2.bench.timing import interleaved, timed
from gpt2.model import GPT
from gpt2.runtime.device import autocast, resolve_dtype
from gpt2.train import Trainer, TrainingData, configure_optimizer, flops_per_token, peak_flops
from gpt2.train.config import TrainConfig

OPTIMIZERS = ("adamw", "muon")
OURS, NANOGPT = "ours", "nanoGPT model.py"  # the engines' names; the peer's is its records' peer


@dataclass(frozen=True)
class TrainGrid:
    """What `gpt2 bench train` runs."""

    optimizers: tuple[str, ...] = ("adamw",)
    batch_size: int = 4
    block_size: int = 256
    dtype: str = "auto"
    """'auto': bf16 autocast where the device computes it fast (as `gpt2 train`), else float32."""
    compile: bool = False
    nanogpt: Path | None = None
    """A nanoGPT checkout: its model.py is the peer."""
    target_loss: float | None = None
    data: Path | None = None
    """A text file to train on for the time to target_loss."""
    max_steps: int = 2000
    peak_flops: float | None = None
    """The peak FLOP/s MFU is measured against; None: the device's bf16 peak where known (no MFU elsewhere)."""

    def __post_init__(self) -> None:
        if not self.optimizers:
            raise ValueError(f"--optimizers names no optimizer; give one or more of {', '.join(OPTIMIZERS)}")
        for name in self.optimizers:
            if name not in OPTIMIZERS:
                raise ValueError(f"optimizer {name!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.nanogpt is not None and not (Path(self.nanogpt) / "model.py").is_file():
            raise FileNotFoundError(f"no model.py in {self.nanogpt}; pass a nanoGPT checkout (github karpathy/nanoGPT)")
        if self.target_loss is not None and (self.data is None or not Path(self.data).is_file()):
            raise FileNotFoundError("--target-loss needs --data FILE, a text file to train on")


class FixedBatch:
    """A batch source that returns the same (x, y): the step's cost without the data loader's."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.batch = (tokens[:, :-1], tokens[:, 1:])

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class TextBatches(FixedBatch):
    """Random windows of a token stream, seeded."""

    def __init__(self, ids: torch.Tensor, batch_size: int, block_size: int) -> None:
        if ids.numel() <= block_size + 1:
            raise ValueError(f"the data holds {ids.numel()} tokens, fewer than block_size + 2 = {block_size + 2}")
        self.ids, self.batch_size, self.block_size = ids, batch_size, block_size
        self.generator = torch.Generator().manual_seed(SEED)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.ids.numel() - self.block_size - 1, (self.batch_size,), generator=self.generator)
        rows = torch.stack([self.ids[s : s + self.block_size + 1] for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]


def train_config(grid: TrainGrid, optimizer: str, device: torch.device, out_dir: str) -> TrainConfig:
    return TrainConfig.from_dict(dict(optimizer=optimizer, dtype=grid.dtype, device=str(device), compile=grid.compile,
                                      batch_size=grid.batch_size, max_steps=grid.max_steps, warmup_steps=10,
                                      log_interval=10**9, eval_interval=0, checkpoint_interval=10**9,
                                      out_dir=out_dir))  # fmt: skip


def ours_step(settings: BenchSettings, grid: TrainGrid, optimizer: str, out_dir: str) -> Callable[[], float]:
    """One `Trainer.train_step` (seconds) of the bench model on a fixed random batch."""
    device = settings.torch_device
    model = bench_model(settings).to(device).train()
    config = train_config(grid, optimizer, device, out_dir)
    tokens = torch.randint(0, model.config.vocab_size, (grid.batch_size, grid.block_size + 1),
                           generator=torch.Generator().manual_seed(SEED))  # fmt: skip
    trainer = Trainer(model, configure_optimizer(model, config.optimizer, device), config,
                      TrainingData(FixedBatch(tokens)))  # fmt: skip
    return lambda: trainer.train_step().seconds


def nanogpt_step(settings: BenchSettings, grid: TrainGrid, dtype: torch.dtype) -> Callable[[], float]:
    """One step of nanoGPT's model.py as its train.py runs it (autocast forward, backward, clip 1.0, its
    configure_optimizers' AdamW, zero), same shape and batch; seconds, the device synchronized."""
    assert grid.nanogpt is not None
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(grid.nanogpt) / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["nanogpt_model"] = module
    spec.loader.exec_module(module)
    ours = bench_model(settings).config
    config = module.GPTConfig(block_size=ours.block_size, vocab_size=ours.vocab_size, n_layer=ours.n_layer,
                              n_head=ours.n_head, n_embd=ours.n_embd, dropout=0.0, bias=True)  # fmt: skip
    device = settings.torch_device
    torch.manual_seed(SEED)
    with contextlib.redirect_stdout(sys.stderr):  # its reports of parameter counts stay off the records
        model = module.GPT(config).to(device).train()
        optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    forward = torch.compile(model) if grid.compile else model
    tokens = torch.randint(0, ours.vocab_size, (grid.batch_size, grid.block_size + 1),
                           generator=torch.Generator().manual_seed(SEED)).to(device)  # fmt: skip
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # as nanoGPT's get_batch makes them

    def step() -> None:
        with autocast(device, dtype):
            _, loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return lambda: timed(step, device)


def run_train(settings: BenchSettings, grid: TrainGrid, recorder: Recorder) -> None:
    """`gpt2 bench train`: per optimizer, step time, tokens/s and MFU; nanoGPT (AdamW) beside ours' AdamW."""
    device = settings.torch_device
    model_config = bench_model(settings).config.replace(block_size=grid.block_size)
    tokens_per_step = grid.batch_size * grid.block_size
    peak = grid.peak_flops or peak_flops(device)
    with tempfile.TemporaryDirectory(prefix="gpt2-bench-train-") as out_dir:
        for optimizer in grid.optimizers:
            ours = ours_step(settings, grid, optimizer, out_dir)
            dtype = resolve_dtype(grid.dtype, device)  # type: ignore[arg-type]  # what the Trainer autocasts to
            theirs = nanogpt_step(settings, grid, dtype) if grid.nanogpt and optimizer == "adamw" else None
            engines = {OURS: ours} | ({NANOGPT: theirs} if theirs is not None else {})
            warmup = settings.warmup + (2 if grid.compile else 0)  # a compiled step settles after its first two
            seconds = interleaved(engines, warmup=warmup, repetitions=settings.repetitions)
            mine, peer = seconds[OURS], seconds.get(NANOGPT, [])
            params = {"optimizer": optimizer, "batch": grid.batch_size, "block": grid.block_size,
                      "dtype": str(dtype).removeprefix("torch."), "compile": grid.compile, "device": device.type,
                      **settings.model_params()}  # fmt: skip
            peer_of = (lambda values: (NANOGPT, values)) if peer else (lambda values: None)
            recorder.add("train", "step time", params, [s * 1e3 for s in mine], "ms", peer_of([s * 1e3 for s in peer]))
            rates = [tokens_per_step / s for s in mine]
            recorder.add("train", "tokens/s", params, rates, "tokens/s", peer_of([tokens_per_step / s for s in peer]))
            if peak is not None:
                mfu = [100 * flops_per_token(model_config) * rate / peak for rate in rates]
                peer_mfu = [100 * flops_per_token(model_config) * tokens_per_step / s / peak for s in peer]
                recorder.add("train", "MFU", params | {"peak_tflops": peak / 1e12}, mfu, "%", peer_of(peer_mfu))
        if grid.target_loss is not None:
            time_to_loss(settings, grid, recorder, out_dir)


def time_to_loss(settings: BenchSettings, grid: TrainGrid, recorder: Recorder, out_dir: str) -> None:
    """Seconds and steps of `Trainer.train_step` (first optimizer) until the mean loss of the last 10 steps is at
    most grid.target_loss, on random windows of grid.data tokenized with the bench tokenizer."""
    assert grid.data is not None and grid.target_loss is not None
    device = settings.torch_device
    ids = torch.tensor(bench_tokenizer(settings).encode(Path(grid.data).read_text(encoding="utf-8")))
    model: GPT = bench_model(settings).to(device).train()
    config = train_config(grid, grid.optimizers[0], device, out_dir)
    trainer = Trainer(model, configure_optimizer(model, config.optimizer, device), config,
                      TrainingData(TextBatches(ids, grid.batch_size, grid.block_size)))  # fmt: skip
    seconds, losses = 0.0, list[float]()
    while trainer.step < grid.max_steps:
        stats = trainer.train_step()
        seconds += stats.seconds
        losses = [*losses[-9:], stats.loss]
        if sum(losses) / len(losses) <= grid.target_loss:
            break
    else:
        raise ValueError(f"the loss did not reach {grid.target_loss} in {grid.max_steps} steps; raise --max-steps")
    params = {"optimizer": grid.optimizers[0], "target_loss": grid.target_loss, "data": str(grid.data),
              "batch": grid.batch_size, "block": grid.block_size, **settings.model_params()}  # fmt: skip
    recorder.add("train", "time to target loss", params, [seconds], "s")
    recorder.add("train", "steps to target loss", params, [float(trainer.step)], "steps")
