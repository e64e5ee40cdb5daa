"""Training: the config, the LR schedule, the optimizer, the loop, training-state checkpoints, DDP/FSDP.

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
import dataclasses
import json
import math
import os
import shutil
import signal
import time
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch
import torch.distributed as torch_dist
import torch.nn as nn

from gpt2.config import PRESETS as MODEL_PRESETS
from gpt2.config import GPTConfig
from gpt2.model import GPT

DeviceName = str  # "auto", "cpu", "cuda", "cuda:1", ...
DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
TokenizerSpec = str  # "byte", "bpe" (train one on the corpus), or a tokenizer directory / Hub name
Parallel = Literal["ddp", "fsdp"]
OptimizerImpl = Literal["auto", "fused", "foreach", "for-loop"]

TRAIN_STATE_FILE = "train_state.pt"
TRAIN_CONFIG_FILE = "train_config.json"
TRAIN_STATE_FORMAT = "gpt2-train-state"
TRAIN_STATE_VERSION = 1
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step_"
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


# ================================================================================================ config
@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs, validated at construction. Presets in `PRESETS`; load a TOML file with
    `TrainConfig.from_toml(path, **overrides)`: a flat table of these fields, plus optionally `preset = "name"`
    to start from a preset.
    """

    # --- data and tokenizer
    data: str = "stdlib"
    """'stdlib' (the built-in corpus: this Python's standard library source), a text file or folder of text
    files (tokenized into OUT/data), or a folder prepared by `gpt2 prepare` (has manifest.json)."""
    tokenizer: TokenizerSpec = "bpe"
    """'bpe': train a byte-level BPE of `vocab_size` ids on the corpus; 'byte': UTF-8 bytes (257 ids); or a
    tokenizer directory / Hub name (e.g. 'gpt2')."""
    vocab_size: int = 4096
    """Vocabulary size of the BPE trained when tokenizer='bpe' (ignored otherwise: the tokenizer decides)."""
    max_corpus_bytes: int | None = None
    """Use only the first files of the corpus up to this many bytes (quick trials, tests); None = all of it."""
    val_fraction: float = 0.1
    """The last fraction of the token stream held out as the val split (when this run tokenizes the data)."""

    # --- model (a GPTConfig preset, with optional changes)
    model: str = "gpt2-mini"
    """Model shape preset from gpt2.config.PRESETS; the fields below override it when set."""
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int | None = None
    """Context length used for training (also the model's number of positions)."""
    dropout: float | None = None

    # --- batch
    batch_size: int = 16
    """Sequences per micro-step per process."""
    grad_accum_steps: int = 1
    """Micro-steps per optimizer step (ignored when total_batch_tokens is set)."""
    total_batch_tokens: int | None = None
    """Tokens per optimizer step over all processes; grad_accum_steps is then derived as
    total_batch_tokens / (batch_size * block_size * world_size), which must divide exactly."""

    # --- optimization (AdamW, linear warmup, cosine decay)
    max_steps: int = 1000
    """Optimizer steps; the cosine decay ends here."""
    learning_rate: float = 6e-4
    """Peak learning rate, reached at the end of warmup."""
    min_lr_ratio: float = 0.1
    """The learning rate decays to learning_rate * min_lr_ratio."""
    warmup_steps: int = 100
    weight_decay: float = 0.1
    """Applied to the 2-D parameters (matmul weights, embeddings) only; biases and LayerNorm gains get 0."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    optimizer_impl: OptimizerImpl = "auto"
    """AdamW implementation: 'auto' = fused where available (CUDA, and CPU), else foreach."""

    # --- evaluation, logging, checkpoints
    eval_interval: int = 100
    """Evaluate on the val split every this many steps (and at the first and last step); 0 = never."""
    eval_batches: int = 20
    """Batches per evaluation (per process)."""
    log_interval: int = 1
    """Write a metrics line every this many steps."""
    checkpoint_interval: int = 500
    """Save a training checkpoint every this many steps (and always at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many of the most recent checkpoints to keep."""
    out_dir: str = "out/stdlib"

    # --- sample printed at the end
    sample_prompt: str = "def "
    sample_tokens: int = 200
    """Tokens to generate after training (0 = no sample)."""
    sample_temperature: float = 0.8
    sample_top_k: int | None = 50

    # --- systems
    device: DeviceName = "auto"
    """'auto' (CUDA when present, else CPU), or a torch device string such as 'cpu' or 'cuda:0'."""
    dtype: DtypeName = "auto"
    """Autocast dtype: 'auto' = bfloat16 on CUDA when supported (float16 + GradScaler otherwise); on a CPU
    bfloat16 when it has native bf16 instructions (AVX512-BF16, AMX), else float32. Parameters and optimizer
    state stay float32."""
    compile: bool = False
    """torch.compile the model for training steps."""
    parallel: Parallel = "ddp"
    """Under torchrun (WORLD_SIZE > 1): 'ddp' replicates the model; 'fsdp' shards parameters, gradients and
    optimizer state (FSDP2 fully_shard per block) for models that do not fit one device."""
    seed: int = 1337

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            _check_type(field.name, getattr(self, field.name), hints[field.name])
        positive = ("vocab_size", "batch_size", "grad_accum_steps", "max_steps", "eval_batches", "log_interval",
                    "keep_checkpoints")  # fmt: skip
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("n_layer", "n_head", "n_embd", "block_size", "total_batch_tokens", "max_corpus_bytes",
                     "sample_top_k"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer or unset, got {value}")
        for name in ("warmup_steps", "eval_interval", "checkpoint_interval", "sample_tokens", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.tokenizer == "bpe" and self.vocab_size < 257:
            raise ValueError(f"vocab_size must be at least 257 (256 bytes + <|endoftext|>), got {self.vocab_size}")
        if self.model not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {self.model!r}; choose one of: {', '.join(MODEL_PRESETS)}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if not self.sample_temperature >= 0:
            raise ValueError(f"sample_temperature must be >= 0, got {self.sample_temperature}")
        if self.dtype not in typing.get_args(DtypeName):
            raise ValueError(f"dtype must be one of {typing.get_args(DtypeName)}, got {self.dtype!r}")
        if self.parallel not in typing.get_args(Parallel):
            raise ValueError(f"parallel must be one of {typing.get_args(Parallel)}, got {self.parallel!r}")
        if self.optimizer_impl not in typing.get_args(OptimizerImpl):
            raise ValueError(
                f"optimizer_impl must be one of {typing.get_args(OptimizerImpl)}, got {self.optimizer_impl!r}"
            )
        if not self.out_dir:
            raise ValueError("out_dir must not be empty; pass out_dir=DIR")
        self.model_config(vocab_size=257)  # the model overrides must make a valid GPTConfig (n_embd % n_head, ...)

    # ---------------------------------------------------------------------------------- construction
    @classmethod
    def field_names(cls) -> list[str]:
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """A config from plain values; an unknown key is a ValueError that lists the valid ones."""
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown training config key(s) {unknown}; valid keys: {', '.join(cls.field_names())}")
        return cls(**values)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "TrainConfig":
        """A preset by name, with optional field overrides: `TrainConfig.from_name("stdlib", max_steps=50)`."""
        if name not in PRESETS:
            raise ValueError(f"unknown training preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name].to_dict(), **overrides})

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **overrides: Any) -> "TrainConfig":
        """Read a TOML file of config keys (optionally `preset = "name"` as the starting point), then apply
        `overrides`. Unknown keys are an error listing the valid ones."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"training config file {str(path)!r} does not exist")
        try:
            values = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path} is not valid TOML: {err}") from err
        nested = [key for key, value in values.items() if isinstance(value, dict)]
        if nested:
            raise ValueError(f"{path}: tables {nested} are not supported; write the keys at the top level")
        preset = values.pop("preset", None)
        base = PRESETS[_check_preset(preset)].to_dict() if preset is not None else {}
        return cls.from_dict({**base, **values, **overrides})

    def replace(self, **changes: Any) -> "TrainConfig":
        return self.from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The config as a TOML file that `from_toml` reads back (unset fields are written as comments)."""
        lines = []
        for name, value in self.to_dict().items():
            lines.append(f"# {name} = (unset)" if value is None else f"{name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------------------------------- derived
    def model_config(self, vocab_size: int) -> GPTConfig:
        """The GPTConfig this run trains, for a tokenizer of `vocab_size` ids."""
        overrides = {
            name: getattr(self, name)
            for name in ("n_layer", "n_head", "n_embd", "block_size", "dropout")
            if getattr(self, name) is not None
        }
        return GPTConfig.from_name(self.model, vocab_size=vocab_size, **overrides)

    @property
    def min_lr(self) -> float:
        return self.learning_rate * self.min_lr_ratio


def _check_type(name: str, value: Any, hint: Any) -> None:
    """A ValueError unless `value` fits the field's annotation (int, float, str, bool, Literal, X | None)."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for option in allowed:
        if option is type(None) and value is None:
            return
        if typing.get_origin(option) is Literal and isinstance(value, str):
            return  # the member check comes later with a message listing the choices
        if option is bool and isinstance(value, bool):
            return
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if option is str and isinstance(value, str):
            return
    expected = " or ".join(
        "none" if option is type(None) else "str" if typing.get_origin(option) is Literal else option.__name__
        for option in allowed
    )
    raise ValueError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")


def _check_preset(name: Any) -> str:
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown training preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return name


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    return repr(value)


def parse_override(assignment: str) -> tuple[str, Any]:
    """'key=value' -> (key, value), the value read as a TOML value ('12', '3e-4', 'true', '"x"') and as a
    plain string when it is not one ('cpu', 'out/run1').

    >>> parse_override("max_steps=200"), parse_override("device=cpu")
    (('max_steps', 200), ('device', 'cpu'))
    """
    key, sep, raw = assignment.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ValueError(f"override {assignment!r} is not KEY=VALUE (e.g. --set max_steps=200)")
    raw = raw.strip()
    if raw.lower() in ("none", "null"):
        return key, None
    try:
        return key, tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return key, raw


def load_config(source: str | os.PathLike[str] | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """The config of a preset name or a TOML file path (default: the "stdlib" preset), with 'key=value'
    overrides applied."""
    values = dict(parse_override(item) for item in overrides or [])
    if source is None:
        source = "stdlib"
    if str(source) in PRESETS:
        return TrainConfig.from_name(str(source), **values)
    if str(source).endswith(".toml") or Path(source).exists():
        return TrainConfig.from_toml(source, **values)
    raise ValueError(f"{str(source)!r} is neither a training preset ({', '.join(PRESETS)}) nor a TOML file")


PRESETS: dict[str, TrainConfig] = {
    # The main job: a small GPT-2 on this Python's standard library, with its own BPE, in a few CPU minutes.
    "stdlib": TrainConfig(
        data="stdlib", tokenizer="bpe", vocab_size=4096,
        model="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=128, dropout=0.0,
        batch_size=16, max_steps=800, learning_rate=2e-3, warmup_steps=30, min_lr_ratio=0.1,
        weight_decay=0.1, beta2=0.99, eval_interval=100, eval_batches=8, checkpoint_interval=200,
        out_dir="out/stdlib", sample_prompt="def",  # "def " would end in a lone-space token, rare in training
    ),
    # nanoGPT's shakespeare-char CPU recipe, on UTF-8 bytes (the text is ASCII, so byte = character).
    "shakespeare-char": TrainConfig(
        data="tinyshakespeare.txt", tokenizer="byte",
        model="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        batch_size=12, max_steps=2000, learning_rate=1e-3, warmup_steps=100, min_lr_ratio=0.1,
        weight_decay=0.1, beta2=0.99, eval_interval=250, eval_batches=20, checkpoint_interval=1000,
        out_dir="out/shakespeare-char", sample_prompt="ROMEO:", sample_tokens=300,
    ),
    # GPT-2 124M reproduction (llm.c / build-nanogpt): ~0.5M tokens per step, 10B tokens of FineWeb.
    "gpt2-124m": TrainConfig(
        data="data/fineweb10B", tokenizer="gpt2",
        model="gpt2", block_size=1024, dropout=0.0,
        batch_size=32, total_batch_tokens=524_288, max_steps=19_073, learning_rate=6e-4, warmup_steps=715,
        min_lr_ratio=0.1, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
        eval_interval=250, eval_batches=20, checkpoint_interval=2000, keep_checkpoints=3,
        out_dir="out/gpt2-124m", sample_prompt="Hello, I'm a language model,", sample_top_k=50,
        compile=True,
    ),
}  # fmt: skip


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


# ============================================================================= device, precision, MFU
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


def resolve_device(name: DeviceName, dist: Distributed = Distributed()) -> torch.device:
    """'auto' -> this rank's CUDA device when CUDA is present, else the CPU; other names as torch reads them."""
    if name == "auto":
        return torch.device("cuda", dist.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"device {name!r} is not a torch device name; use 'auto', 'cpu' or 'cuda[:N]'") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} was asked for but CUDA is not available; use device=cpu")
        if device.index is None:
            device = torch.device("cuda", dist.local_rank)
    return device


def resolve_dtype(name: DtypeName, device: torch.device) -> torch.dtype:
    """The autocast dtype: 'auto' = bf16 on CUDA where supported, else fp16 (with a GradScaler); on a CPU
    bf16 where it has native bf16 instructions (AVX512-BF16 or AMX), else fp32. On the 2-core AVX512-BF16 VM
    of docs/benchmarks.md bf16 trains ~1.4x faster with the same shakespeare-char curve (val 1.874 vs 1.872)."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and _cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _cpu_has_native_bf16() -> bool:
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, check, lambda: False)()) for check in checks)


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """The one autocast context of a run (a no-op for float32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a wall-clock time measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
        from gpt2.corpus import stdlib_files

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
    from gpt2.tokenizer import ByteTokenizer, Tokenizer

    if spec == "byte":
        return ByteTokenizer()
    if spec == "bpe":
        raise ValueError(f"tokenizer='bpe' (train one) cannot be used for {purpose}; pass the tokenizer directory")
    return Tokenizer.from_pretrained(spec)


# ====================================================================================== checkpoints
class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the step was not applied and no checkpoint was written after it."""


def checkpoint_dirs(out_dir: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoint folders of a run, oldest first (a temporary folder is never listed)."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    found = checkpoint_dirs(out_dir)
    return found[-1] if found else None


def save_checkpoint(
    out_dir: Path,
    step: int,
    model: GPT,
    tokenizer: Any,
    state: dict[str, Any],
    config: TrainConfig,
    keep: int,
) -> Path:
    """Write OUT/checkpoints/step_N atomically (a temporary folder renamed into place), drop all but the last
    `keep`, then refresh the top-level model and tokenizer in OUT. `state` holds plain tensors and containers."""
    from gpt2.checkpoint import save_pretrained

    root = out_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{CHECKPOINT_PREFIX}{step:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        save_pretrained(model, tmp)
        tokenizer.save(tmp)
        (tmp / TRAIN_CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=1) + "\n")
        with open(tmp / TRAIN_STATE_FILE, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():  # the same step saved again (e.g. interrupted right after a scheduled save)
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in root.iterdir():  # temporary folders of killed runs
        if stale.name.startswith(".tmp-") and stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    for old in checkpoint_dirs(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    save_pretrained(model, out_dir)  # the latest weights at the top level, for `gpt2 sample --model OUT`
    tokenizer.save(out_dir)
    return final


def load_train_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The training state of a checkpoint folder, read with weights_only=True: only tensors and plain
    containers are rebuilt; anything else in the pickle is refused, never executed."""
    path = Path(checkpoint_dir) / TRAIN_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {checkpoint_dir} is not a complete training checkpoint")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for a disallowed global, or a corrupt file
        raise ValueError(f"{path} is not a plain training state and was refused (nothing in it was run): {err}") from err
    if not isinstance(state, dict) or state.get("format") != TRAIN_STATE_FORMAT:
        raise ValueError(f"{path} is not a {TRAIN_STATE_FORMAT} file")
    if state.get("version") != TRAIN_STATE_VERSION:
        raise ValueError(f"{path} has version {state.get('version')!r}; this gpt2 reads {TRAIN_STATE_VERSION}")
    return state


def load_checkpoint_weights(model: GPT, checkpoint_dir: Path) -> None:
    """Copy the checkpoint's model.safetensors into `model`, refusing a different model shape."""
    from gpt2.checkpoint import config_from_hf, load_hf_state_dict, read_hf_state_dict

    saved = config_from_hf(json.loads((checkpoint_dir / "config.json").read_text()))
    ours = model.config
    for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        if getattr(saved, name) != getattr(ours, name):
            raise ValueError(
                f"cannot resume from {checkpoint_dir}: it has {name}={getattr(saved, name)} but this run has "
                f"{name}={getattr(ours, name)}; resume with the same model settings or use another out_dir"
            )
    load_hf_state_dict(model, read_hf_state_dict(checkpoint_dir))


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


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
        device = resolve_device(config.device, dist)
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
    device = resolve_device(config.device, dist)
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
