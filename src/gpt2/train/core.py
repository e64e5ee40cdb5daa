"""Training: the LR schedule, the optimizer, the loop, DDP/FSDP. The config is in train_config.py, the
resumable checkpoints in train_checkpoint.py, device and precision in device.py.

One optimizer step reads as a recipe (llm.c's order): set the LR; run `grad_accum_steps` micro-steps, each
adding loss / grad_accum_steps to the gradients; clip; step; zero the gradients; synchronize the device; log.

    >>> config = TrainConfig.from_name("stdlib", max_steps=10, out_dir="out/try")   # doctest: +SKIP
    >>> result = train(config)                                                       # doctest: +SKIP

Output directory layout (OUT = config.out_dir):

- OUT/config.json, OUT/model.safetensors and the tokenizer files: the latest weights, so `GPT.from_pretrained(OUT)`
  and `gpt2 sample --model OUT` work during and after training.
- OUT/checkpoints/step_00000100/: the same model + tokenizer files plus `train_state.pt` (optimizer, step, RNG
  states, data position; plain tensors and containers, read back with `torch.load(weights_only=True)`) and
  `train_config.json`. Each is written into a hidden temporary folder and renamed into place, so a folder
  named step_* is always complete; the last `keep_checkpoints` are kept.
- OUT/metrics.jsonl (one JSON object per logged step or evaluation), OUT/loss.png (train and val curves).
- OUT/data/: the tokenized corpus and the tokenizer trained for it (reused by later runs with the same data).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as torch_dist
import torch.nn as nn

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.runtime.device import autocast, resolve_device, resolve_dtype, synchronize
from gpt2.train.checkpoint import (
    CHECKPOINTS_DIR,
    TRAIN_STATE_FORMAT,
    TRAIN_STATE_VERSION,
    checkpoint_dirs,
    latest_checkpoint,
    load_checkpoint_weights,
    load_train_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from gpt2.train.config import TrainConfig

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"
DATA_DIR = "data"
DATA_KEY_FILE = "source.json"
EVAL_SEED_OFFSET = 1_000_003  # the val loader's seed is config.seed + this, so it never shares the train stream

# Peak dense bf16/fp16 tensor-core FLOP/s per device (vendor datasheets, no sparsity), for MFU. Matched by
# substring of torch.cuda.get_device_name(); the first match wins, so longer names come first.
PEAK_FLOPS_BF16: dict[str, float] = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 70e12,  # 140e12 with sparsity
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,  # fp16 (no bf16 on Volta)
    "T4": 65e12,  # fp16
}


# ============================================================================================ schedule
def learning_rate_at(step: int, *, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warmup to max_lr over warmup_steps (step 0
    already gets max_lr / warmup_steps, as in llm.c), then cosine decay to min_lr at step decay_steps, then
    min_lr.

    >>> [round(learning_rate_at(s, max_lr=1.0, min_lr=0.1, warmup_steps=2, decay_steps=4), 3) for s in range(5)]
    [0.5, 1.0, 1.0, 0.55, 0.1]
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)  # 0 -> 1 over the decay
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


# =========================================================================================== optimizer
def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: the 2-D tensors (matmul weights and embeddings) decay; biases and LayerNorm parameters
    (1-D) do not. Every trainable parameter is in exactly one group (the tied head/embedding once)."""
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() yields a tied tensor once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def configure_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `parameter_groups`, with the implementation `config.optimizer_impl` asks for."""
    impl = config.optimizer_impl
    if impl == "auto":
        impl = "fused" if device.type in ("cuda", "cpu") else "foreach"
    options = {"fused": impl == "fused", "foreach": impl == "foreach"} if impl != "for-loop" else {"foreach": False}
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.learning_rate,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        **options,
    )


# ================================================================================ distributed, MFU
@dataclass(frozen=True)
class Distributed:
    """This process's place in a torchrun job (rank 0 of 1 when not launched by torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def distributed_from_env() -> Distributed:
    """Read torchrun's RANK / LOCAL_RANK / WORLD_SIZE."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Distributed(int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")), world_size)


def flops_per_token(config: GPTConfig) -> float:
    """Training FLOPs per token, forward + backward (PaLM appendix B, as nanoGPT's MFU): 6 per parameter
    (2 forward, 4 backward) plus the attention scores and weighted sums, 12 * n_layer * n_embd * block_size."""
    C, L, V, T = config.n_embd, config.n_layer, config.vocab_size, config.block_size
    # per block: attention 4C^2 + MLP 8C^2 weights, plus biases and LayerNorms (13C with bias, 2C without)
    per_block = 12 * C * C + (13 * C if config.bias else 2 * C)
    n_params = V * C + T * C + L * per_block + 2 * C  # tied embedding/head counted once, final LayerNorm
    return 6 * n_params + 12 * L * C * T


def peak_flops(device: torch.device) -> float | None:
    """Peak bf16 FLOP/s of `device` from PEAK_FLOPS_BF16, or None when unknown (then no MFU is shown)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS_BF16.items() if key in name), None)


# ======================================================================================== data set-up
def prepare_data(config: TrainConfig, out_dir: Path, progress: bool = False) -> tuple[Any, Path]:
    """(tokenizer, prepared data folder) for `config.data`, tokenizing into OUT/data when needed. A folder made
    by an earlier run from the same data and tokenizer settings is reused."""
    from gpt2.data import MANIFEST_NAME, prepare, read_manifest

    data_path = Path(config.data)
    if config.data != "stdlib" and (data_path / MANIFEST_NAME).is_file():
        tokenizer = _load_tokenizer(config.tokenizer, purpose=f"data={config.data} (already tokenized)")
        identity = read_manifest(data_path)["tokenizer"]["identity"]
        if identity != tokenizer.identity:
            raise ValueError(
                f"{config.data} was tokenized with {identity}, but tokenizer={config.tokenizer!r} is "
                f"{tokenizer.identity}; pass the tokenizer the data was prepared with"
            )
        return tokenizer, data_path

    if config.data == "stdlib":
        from gpt2.data.corpus import stdlib_files

        sources = stdlib_files(config.max_corpus_bytes)
    else:
        if not data_path.exists():
            raise FileNotFoundError(
                f"training data {config.data!r} does not exist; pass data=PATH (a text file, a folder of text "
                "files, or a folder prepared by `gpt2 prepare`), or data=stdlib for the built-in corpus"
            )
        sources = [data_path]
        if config.max_corpus_bytes is not None:
            raise ValueError("max_corpus_bytes applies to data=stdlib only; cut your text file instead")

    data_dir = out_dir / DATA_DIR
    key = {
        "data": config.data,
        "tokenizer": config.tokenizer,
        "vocab_size": config.vocab_size if config.tokenizer == "bpe" else None,
        "val_fraction": config.val_fraction,
        "sources": [[str(path), path.stat().st_size] for path in sources if path.is_file()],
    }
    key_path = data_dir / DATA_KEY_FILE
    if key_path.is_file() and (data_dir / MANIFEST_NAME).is_file() and json.loads(key_path.read_text()) == key:
        return _load_tokenizer(str(data_dir / "tokenizer"), purpose="the tokenizer of this run's data"), data_dir

    if config.tokenizer == "bpe":
        from gpt2.tokenizer import train_tokenizer

        tokenizer = train_tokenizer(sources, config.vocab_size)
    else:
        tokenizer = _load_tokenizer(config.tokenizer, purpose="tokenizing the data")
    if data_dir.exists():
        shutil.rmtree(data_dir)  # made from other settings; the key file says this folder is ours to replace
    prepare(sources, data_dir, tokenizer, val_fraction=config.val_fraction, progress=progress)
    tokenizer.save(data_dir / "tokenizer")
    key_path.write_text(json.dumps(key, indent=1) + "\n")  # written last: its presence means the folder is done
    return tokenizer, data_dir


def _load_tokenizer(spec: str, purpose: str) -> Any:
    from gpt2.tokenizer import load_tokenizer

    if spec == "bpe":
        raise ValueError(f"tokenizer='bpe' (train one) cannot be used for {purpose}; pass the tokenizer directory")
    return load_tokenizer(spec)


# ======================================================================================= divergence
class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the step was not applied and no checkpoint was written after it."""


def step_seed(seed: int, rank: int, step: int) -> int:
    """The torch seed of optimizer step `step` on `rank`: the step's randomness (dropout) is a function of
    (seed, rank, step) alone, so a resumed run draws exactly what an uninterrupted one would."""
    words = np.random.SeedSequence([seed, rank, step]).generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


# ============================================================================================ metrics
class Metrics:
    """metrics.jsonl (one JSON object per line) plus the records in memory for the loss plot."""

    def __init__(self, path: Path, resume_step: int | None, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []
        if not enabled:
            return
        if resume_step is not None and path.is_file():
            # keep what happened up to the checkpoint; later lines belong to the run being replaced
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record["step"] <= resume_step:  # an evaluation at resume_step ran before its checkpoint
                    self.records.append(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def plot(self, path: Path) -> None:
        if self.enabled:
            write_loss_plot(self.records, path)


def write_loss_plot(records: list[dict[str, Any]], path: Path) -> None:
    """A PNG of train loss per step and val loss per evaluation (matplotlib's Agg canvas: no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    figure = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if train:
        axes.plot(*zip(*train), label="train", color="tab:blue", alpha=0.6, linewidth=1)
    if val:
        axes.plot(*zip(*val), "o-", label="val", color="tab:orange", linewidth=1.5, markersize=4)
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats/token)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png")
    os.replace(tmp, path)


# ============================================================================================ the loop
@dataclass
class TrainResult:
    """What a run did: per-step train losses (index 0 = step start_step+1), val losses by step, and files."""

    start_step: int
    step: int
    losses: list[float]
    val_losses: dict[int, float]
    out_dir: Path
    checkpoint: Path | None
    interrupted: bool = False
    sample: str | None = None
    tokens_per_second: float = 0.0
    seconds: float = 0.0


class _StopFlag:
    """Ctrl-C (SIGINT) sets the flag; the loop finishes its step, saves and returns. A second Ctrl-C raises
    KeyboardInterrupt at once. Only installed in the main thread."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> "_StopFlag":
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train as `config` says, writing checkpoints, metrics and the loss plot into config.out_dir.

    resume: continue from the latest checkpoint in out_dir (exactly: same losses and weights as an
    uninterrupted run on CPU). overwrite: start from scratch even though out_dir holds checkpoints of another
    run (they are deleted); without it that is a FileExistsError. stop_at_step: save and return after this step although the schedule runs to
    max_steps (to split a run into pieces). progress: show a progress bar. log: receives status lines.
    Under torchrun this runs data-parallel (config.parallel); only rank 0 logs and writes.
    Raises TrainingDiverged on a non-finite loss (the last good checkpoint is left as it was).
    """
    dist = distributed_from_env()
    if dist.enabled and not torch_dist.is_initialized():
        device = resolve_device(config.device, dist.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch_dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    try:
        return _train(config, dist, resume, overwrite, stop_at_step, progress, log)
    finally:
        if dist.enabled and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def _train(
    config: TrainConfig,
    dist: Distributed,
    resume: bool,
    overwrite: bool,
    stop_at_step: int | None,
    progress: bool,
    log: Callable[[str], None] | None,
) -> TrainResult:
    say = log if (log is not None and dist.is_main) else (lambda message: None)
    device = resolve_device(config.device, dist.local_rank)
    dtype = resolve_dtype(config.dtype, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls for any float32 work left outside autocast
        torch.backends.cudnn.allow_tf32 = True
    out_dir = Path(config.out_dir)
    if resume and latest_checkpoint(out_dir) is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {out_dir / CHECKPOINTS_DIR}; start without --resume")
    if not resume and checkpoint_dirs(out_dir):
        if not overwrite:
            raise FileExistsError(
                f"{out_dir} already holds a run (latest checkpoint {latest_checkpoint(out_dir).name}); pass --resume "
                "to continue it, --overwrite to start again from scratch, or another out_dir"
            )
        if dist.is_main:
            shutil.rmtree(out_dir / CHECKPOINTS_DIR)
        if dist.enabled:
            torch_dist.barrier()

    # ---- data: rank 0 tokenizes (once per out_dir), the others wait and then read the same folder
    if dist.is_main:
        tokenizer, data_dir = prepare_data(config, out_dir, progress=progress)
    if dist.enabled:
        torch_dist.barrier()
    if not dist.is_main:
        tokenizer, data_dir = prepare_data(config, out_dir, progress=False)
    from gpt2.data import BatchLoader, load_split

    model_config = config.model_config(tokenizer.vocab_size)
    T = model_config.block_size
    train_tokens, val_tokens = load_split(data_dir, "train"), load_split(data_dir, "val")
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        if len(tokens) < T + 1 and (split == "train" or config.eval_interval > 0):
            raise ValueError(
                f"the {split} split of {config.data!r} has {len(tokens)} tokens, fewer than block_size + 1 = "
                f"{T + 1}: give more text or set a smaller block_size"
                + ("" if split == "train" else " (or eval_interval=0 to skip evaluation)")
            )
    B = config.batch_size
    grad_accum = config.grad_accum_steps
    if config.total_batch_tokens is not None:
        per_micro_step = B * T * dist.world_size
        if config.total_batch_tokens % per_micro_step:
            raise ValueError(
                f"total_batch_tokens={config.total_batch_tokens} is not a multiple of batch_size * block_size * "
                f"world_size = {B} * {T} * {dist.world_size} = {per_micro_step}; change one of them"
            )
        grad_accum = config.total_batch_tokens // per_micro_step
    tokens_per_step = B * T * grad_accum * dist.world_size

    # ---- model, optimizer, state
    torch.manual_seed(config.seed)  # the same initial weights on every rank
    model = GPT(model_config)
    start_step = 0
    checkpoint = latest_checkpoint(out_dir) if resume else None
    state: dict[str, Any] | None = None
    if checkpoint is not None:
        state = load_train_state(checkpoint)
        load_checkpoint_weights(model, checkpoint)
        start_step = int(state["step"])
    model.to(device)
    raw_model = model
    fsdp = dist.enabled and config.parallel == "fsdp"
    if fsdp:
        model = _shard(model, device)
    optimizer = configure_optimizer(model, config, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    train_loader = BatchLoader(train_tokens, B, T, rank=dist.rank, world_size=dist.world_size, seed=config.seed)
    if state is not None:
        if fsdp:
            _load_sharded_optimizer(model, optimizer, state["optimizer"])
        else:
            optimizer.load_state_dict(state["optimizer"])
        train_loader.load_state_dict(state["loader"])
        scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"], device)
    if start_step >= config.max_steps:
        raise ValueError(
            f"nothing to do: the checkpoint in {out_dir} is at step {start_step} and max_steps={config.max_steps}; "
            "raise max_steps to train further"
        )
    if dist.enabled and not fsdp:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if config.compile:
        model = torch.compile(model)

    if config.hellaswag_file and not Path(config.hellaswag_file).is_file():
        raise FileNotFoundError(
            f"hellaswag_file {config.hellaswag_file!r} does not exist; pass a HellaSwag JSONL file or leave it unset"
        )
    metrics = Metrics(out_dir / METRICS_FILE, start_step if checkpoint is not None else None, dist.is_main)
    peak = peak_flops(device)
    flops_per_step = flops_per_token(model_config) * tokens_per_step
    say(
        f"training {raw_model.num_parameters():,} parameters on {device} ({str(dtype).removeprefix('torch.')}), "
        f"world size {dist.world_size}: {len(train_tokens):,} train / {len(val_tokens):,} val tokens, "
        f"{tokens_per_step:,} tokens per step (batch {B} x {T} x accum {grad_accum} x {dist.world_size})"
        + (f"; resuming from {checkpoint}" if checkpoint is not None else "")
    )

    def evaluate() -> float:
        """Mean val loss over eval_batches batches per rank; the same batches at every evaluation."""
        loader = BatchLoader(val_tokens, B, T, rank=dist.rank, world_size=dist.world_size,
                             seed=config.seed + EVAL_SEED_OFFSET)  # fmt: skip
        model.eval()
        total = torch.zeros((), device=device)
        with torch.no_grad():
            for _ in range(config.eval_batches):
                x, y = (t.to(device) for t in loader.next_batch())
                with autocast(device, dtype):
                    total += model(x, y).loss.float()
        model.train()
        total /= config.eval_batches
        if dist.enabled:  # SUM then divide: gloo has no AVG
            torch_dist.all_reduce(total, op=torch_dist.ReduceOp.SUM)
            total /= dist.world_size
        return float(total)

    def evaluate_hellaswag_accuracy(step: int) -> None:
        """HellaSwag on `hellaswag_file` (every rank computes the same numbers; rank 0 writes them)."""
        from gpt2.eval import evaluate_hellaswag

        scored_model = model if fsdp else raw_model  # FSDP needs every rank in the forward; DDP does not
        result = evaluate_hellaswag(scored_model, tokenizer, config.hellaswag_file, limit=config.hellaswag_limit)
        metrics.write({"step": step, "hellaswag_acc": result["acc"], "hellaswag_acc_norm": result["acc_norm"]})
        say(f"step {step}: HellaSwag acc_norm {result['acc_norm']:.4f} ({result['num_examples']} examples)")

    def save(step: int, last_loss: float | None, last_val: float | None) -> Path | None:
        train_state = {
            "format": TRAIN_STATE_FORMAT,
            "version": TRAIN_STATE_VERSION,
            "step": step,
            "optimizer": _full_optimizer_state(model, optimizer) if fsdp else optimizer.state_dict(),
            "loader": train_loader.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rng_state(device),
            "loss": last_loss,
            "val_loss": last_val,
        }
        weights_model = _full_model(model, model_config) if fsdp else raw_model
        if not dist.is_main:
            return None
        path = save_checkpoint(out_dir, step, weights_model, tokenizer, train_state, config, config.keep_checkpoints)
        return path

    end_step = config.max_steps if stop_at_step is None else min(stop_at_step, config.max_steps)
    losses: list[float] = []
    val_losses: dict[int, float] = {}
    last_loss: float | None = None
    last_val: float | None = None
    saved: Path | None = checkpoint
    saved_step = start_step if checkpoint is not None else -1
    interrupted = False
    step = start_step
    started = time.perf_counter()
    timed_tokens, timed_seconds = 0, 0.0
    from tqdm.auto import tqdm

    bar = tqdm(total=config.max_steps, initial=start_step, unit="step", dynamic_ncols=True,
               disable=not (progress and dist.is_main))  # fmt: skip
    with _StopFlag() as stop, bar:
        if config.eval_interval and start_step == 0:
            last_val = val_losses[0] = evaluate()
            metrics.write({"step": 0, "val_loss": last_val})
            say(f"step 0: val loss {last_val:.4f}")
            if config.hellaswag_file:
                evaluate_hellaswag_accuracy(0)
        while step < end_step:
            synchronize(device)
            t0 = time.perf_counter()
            # 1. set the learning rate for this step
            lr = learning_rate_at(step, max_lr=config.learning_rate, min_lr=config.min_lr,
                                  warmup_steps=config.warmup_steps, decay_steps=config.max_steps)  # fmt: skip
            for group in optimizer.param_groups:
                group["lr"] = lr
            torch.manual_seed(step_seed(config.seed, dist.rank, step))
            # 2. micro-steps: gradients of loss / grad_accum add up to the gradient of the mean loss
            loss_sum = torch.zeros((), device=device)
            for micro_step in range(grad_accum):
                x, y = (t.to(device, non_blocking=True) for t in train_loader.next_batch())  # (B, T) each
                with _gradient_sync(model, enabled=micro_step == grad_accum - 1):
                    with autocast(device, dtype):
                        loss = model(x, y).loss / grad_accum
                    loss_sum += loss.detach().float()
                    scaler.scale(loss).backward()
            if dist.enabled:  # the logged loss is the mean over all ranks
                torch_dist.all_reduce(loss_sum, op=torch_dist.ReduceOp.SUM)
                loss_sum /= dist.world_size
            step_loss = float(loss_sum)
            if not math.isfinite(step_loss):
                where = f"the last good checkpoint is {saved}" if saved is not None else "no checkpoint was written yet"
                raise TrainingDiverged(
                    f"loss is {step_loss} at step {step + 1}; training stopped before applying it ({where}). "
                    "Lower learning_rate (or raise warmup_steps), check the data, then continue with --resume"
                )
            # 3. clip, step, zero
            scaler.unscale_(optimizer)
            grad_norm = (
                float(nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
                if config.grad_clip > 0 else float("nan")
            )  # fmt: skip
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            # 4. sync, time, log
            synchronize(device)
            dt = time.perf_counter() - t0
            step += 1
            losses.append(step_loss)
            last_loss = step_loss
            if step > start_step + 1 or step == end_step:  # the first step pays one-off costs (compile, warm-up)
                timed_tokens += tokens_per_step
                timed_seconds += dt
            tokens_per_s = tokens_per_step / dt
            postfix = f"loss {step_loss:.4f} lr {lr:.2e} {tokens_per_s:,.0f} tok/s"
            record: dict[str, Any] = {"step": step, "loss": step_loss, "lr": lr, "grad_norm": grad_norm,
                                      "dt_ms": dt * 1000, "tokens_per_s": tokens_per_s}  # fmt: skip
            if peak is not None:
                record["mfu"] = flops_per_step / dt / (peak * dist.world_size)
                postfix += f" MFU {100 * record['mfu']:.1f}%"
            bar.set_postfix_str(postfix, refresh=False)
            bar.update(1)
            if step % config.log_interval == 0 or step == end_step:
                metrics.write(record)
            if config.eval_interval and (step % config.eval_interval == 0 or step == config.max_steps):
                last_val = val_losses[step] = evaluate()
                metrics.write({"step": step, "val_loss": last_val})
                say(f"step {step}: train loss {step_loss:.4f}, val loss {last_val:.4f}")
                if config.hellaswag_file:
                    evaluate_hellaswag_accuracy(step)
                metrics.plot(out_dir / PLOT_FILE)
            stop_now = _any_rank(stop.requested, device, dist)
            if (config.checkpoint_interval and step % config.checkpoint_interval == 0) or step == end_step or stop_now:
                saved = save(step, last_loss, last_val) or saved
                saved_step = step
            if stop_now:
                interrupted = True
                say(f"interrupted: checkpoint at step {step} saved in {saved}; continue with --resume")
                break
    if saved_step != step and step > start_step:  # pragma: no cover - every exit path above saves
        saved = save(step, last_loss, last_val) or saved
    metrics.plot(out_dir / PLOT_FILE)
    result = TrainResult(
        start_step=start_step, step=step, losses=losses, val_losses=val_losses, out_dir=out_dir,
        checkpoint=saved, interrupted=interrupted, seconds=time.perf_counter() - started,
        tokens_per_second=timed_tokens / timed_seconds if timed_seconds else 0.0,
    )  # fmt: skip
    if dist.is_main and config.sample_tokens and not interrupted:
        result.sample = sample_text(raw_model if not fsdp else _full_model(model, model_config), tokenizer, config, device)
    elif fsdp and config.sample_tokens and not interrupted:
        _full_model(model, model_config)  # every rank takes part in gathering the weights
    return result


def sample_text(model: GPT, tokenizer: Any, config: TrainConfig, device: torch.device) -> str:
    """Continue config.sample_prompt by config.sample_tokens tokens (seeded) and decode prompt + continuation."""
    ids = tokenizer.encode(config.sample_prompt) or [tokenizer.eot_token]
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    model.eval()
    out = model.generate(idx, config.sample_tokens, temperature=config.sample_temperature,
                         top_k=config.sample_top_k, seed=config.seed)  # fmt: skip
    return tokenizer.decode(out[0].tolist())


def _gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on all but the last micro-step (DDP no_sync; FSDP2's requires-sync flag)."""
    inner = getattr(model, "_orig_mod", model)
    if hasattr(inner, "no_sync") and not enabled:
        return inner.no_sync()
    if hasattr(inner, "set_requires_gradient_sync"):
        inner.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def _any_rank(flag: bool, device: torch.device, dist: Distributed) -> bool:
    """True when `flag` is set on any rank (so all ranks stop at the same step)."""
    if not dist.enabled:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    torch_dist.all_reduce(value, op=torch_dist.ReduceOp.MAX)
    return bool(value.item())


# ============================================================================================== FSDP
def _shard(model: GPT, device: torch.device) -> GPT:
    """FSDP2: shard each block, then the root (embeddings, final LayerNorm, tied head)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    return model


def _full_model(model: nn.Module, config: GPTConfig) -> GPT:
    """An unsharded CPU copy of an FSDP model. A collective: every rank must call it, in step."""
    full = {name: _unshard(tensor) for name, tensor in model.state_dict().items()}  # FSDP2 keeps the names
    copy = GPT(config)
    copy.load_state_dict(full)
    return copy


def _full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state with every sharded tensor gathered: what one unsharded process would save."""
    state = optimizer.state_dict()
    state["state"] = {
        index: {key: _unshard(value) for key, value in entry.items()} for index, entry in state["state"].items()
    }
    return state


def _load_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a gathered optimizer state, re-sharding each tensor like the parameter it belongs to."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    resharded = {}
    for index, entry in state["state"].items():
        param = params[int(index)]
        resharded[index] = {
            key: distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
            if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.shape
            else value
            for key, value in entry.items()
        }
    optimizer.load_state_dict({**state, "state": resharded})


def _unshard(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor().cpu() if isinstance(tensor, DTensor) else tensor
