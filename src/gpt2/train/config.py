"""The training configuration: one frozen dataclass validated at construction, named presets, TOML files with
`key=value` overrides. An unknown key is an error that lists the valid ones.

    >>> TrainConfig.from_name("stdlib", max_steps=50).max_steps
    50
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

from gpt2.config import PRESETS as MODEL_PRESETS
from gpt2.config import GPTConfig
from gpt2.runtime.device import DtypeName

DeviceName = str  # "auto", "cpu", "cuda", "cuda:1", ...
TokenizerSpec = str  # "bytes" (or "byte"), "bpe" (train one on the corpus), or a tokenizer directory / Hub name
Parallel = Literal["ddp", "fsdp"]
OptimizerImpl = Literal["auto", "fused", "foreach", "for-loop"]
OptimizerName = Literal["adamw", "muon"]
LRSchedule = Literal["cosine", "wsd"]
NSDtype = Literal["auto", "float32", "bfloat16"]

TRACKERS = ("tensorboard", "wandb")


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
    """'bpe': train a byte-level BPE of `vocab_size` ids on the corpus; 'bytes': UTF-8 bytes (257 ids); or a
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
    init_from: str | None = None
    """Start from pretrained weights instead of random ones (nanoGPT's init_from): a model directory, a Hub name
    such as 'gpt2', OpenAI's TF release or an llm.c .bin file. The run then uses that model's tokenizer and shape
    (`tokenizer`, `model`, n_layer, n_head, n_embd are not used); block_size may shorten its context, and
    dropout may be set."""

    # --- batch
    batch_size: int = 16
    """Sequences per micro-step per process."""
    grad_accum_steps: int = 1
    """Micro-steps per optimizer step (ignored when total_batch_tokens is set)."""
    total_batch_tokens: int | None = None
    """Tokens per optimizer step over all processes; grad_accum_steps is then derived as
    total_batch_tokens / (batch_size * block_size * world_size), which must divide exactly."""

    # --- optimization (AdamW or Muon; linear warmup, then cosine decay or warmup-stable-decay)
    optimizer: OptimizerName = "adamw"
    """'adamw': AdamW for every parameter (GPT-2's recipe). 'muon': Muon for the transformer blocks' 2-D weights
    (muon_* settings), AdamW (learning_rate, betas, weight_decay) for embeddings, the tied head, biases and
    LayerNorm gains."""
    max_steps: int = 1000
    """Optimizer steps; the LR decay ends here."""
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
    lr_schedule: LRSchedule = "cosine"
    """After warmup: 'cosine' decay to the floor at max_steps; 'wsd' = hold the peak, then decay linearly to the
    floor over the last decay_fraction of max_steps."""
    decay_fraction: float = 0.2
    """lr_schedule='wsd': the fraction of max_steps spent decaying."""
    muon_lr: float = 0.02
    """optimizer='muon': the Muon matrices' peak LR (scaled by sqrt(max(1, out/in)) per matrix), on the same
    schedule as learning_rate."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum."""
    muon_momentum_warmup_steps: int = 0
    """Raise Muon's momentum linearly from 0.85 to muon_momentum over this many steps (0 = none)."""
    muon_weight_decay: float = 0.0
    """Decoupled weight decay of the Muon matrices (W <- W * (1 - lr * wd))."""
    muon_ns_steps: int = 5
    """Newton-Schulz iterations per step."""
    muon_ns_dtype: NSDtype = "auto"
    """dtype of the Newton-Schulz iterations: 'auto' = bfloat16 on CUDA and on CPUs that multiply it fast (AMX, or
    AMD's AVX512-BF16: 2.2x float32's speed at the char-Shakespeare shape), float32 on other CPUs."""
    muon_compile: bool = False
    """torch.compile the Newton-Schulz iterations."""

    # --- evaluation, logging, checkpoints
    eval_interval: int = 100
    """Evaluate on the val split every this many steps (and at the first and last step); 0 = never."""
    eval_batches: int = 20
    """Batches per evaluation (per process)."""
    hellaswag_file: str | None = None
    """A HellaSwag JSONL file (the official format); when set, completion-style HellaSwag accuracy is measured at
    every evaluation (see eval_interval) and written to metrics.jsonl as hellaswag_acc / hellaswag_acc_norm."""
    hellaswag_limit: int | None = 200
    """HellaSwag examples per evaluation, from the start of the file (None = all of them)."""
    log_interval: int = 1
    """Write a metrics line every this many steps."""
    checkpoint_interval: int = 500
    """Save a training checkpoint every this many steps (and always at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many of the most recent checkpoints to keep."""
    out_dir: str = "out/stdlib"
    log_to: tuple[str, ...] = ()
    """Experiment trackers that receive what metrics.jsonl gets (losses, LR, grad norm, tokens/s, MFU,
    evaluations) plus the config and the sample: any of 'tensorboard' (event files in OUT/tensorboard), 'wandb'
    (offline run in OUT/wandb, no account needed). Each needs its extra: pip install 'gpt2-faithful[NAME]'."""

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
    bfloat16 where its bf16 matmuls beat float32 (AMX, or AVX512-BF16 on AMD), else float32. Parameters and optimizer
    state stay float32."""
    compile: bool = False
    """torch.compile the model for training steps."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass instead of keeping them (same loss and
    gradients, less memory, about a third more compute): for a batch_size that does not fit otherwise."""
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
                     "sample_top_k", "hellaswag_limit"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer or unset, got {value}")
        for name in ("warmup_steps", "eval_interval", "checkpoint_interval", "sample_tokens", "seed",
                     "muon_momentum_warmup_steps", "muon_weight_decay"):  # fmt: skip
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
        for name, choices in (("optimizer", OptimizerName), ("lr_schedule", LRSchedule), ("muon_ns_dtype", NSDtype)):
            if getattr(self, name) not in typing.get_args(choices):
                raise ValueError(f"{name} must be one of {typing.get_args(choices)}, got {getattr(self, name)!r}")
        if not self.muon_lr > 0:
            raise ValueError(f"muon_lr must be positive, got {self.muon_lr}")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ValueError(f"muon_momentum must be in [0, 1), got {self.muon_momentum}")
        if not 1 <= self.muon_ns_steps <= 20:
            raise ValueError(f"muon_ns_steps must be in 1..20, got {self.muon_ns_steps}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
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
        object.__setattr__(self, "log_to", tuple(self.log_to))  # a TOML / JSON list reads as a list
        for tracker in self.log_to:
            if tracker not in TRACKERS:
                raise ValueError(f"log_to: unknown tracker {tracker!r}; choose from {', '.join(TRACKERS)}")
        self.model_config(vocab_size=257)  # the model overrides must make a valid GPTConfig (n_embd % n_head, ...)

    # ---------------------------------------------------------------------------------- construction
    @classmethod
    def field_names(cls) -> list[str]:
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """A config from plain values; an unknown key is a ValueError that lists the valid ones."""
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown training config key(s) {unknown}; valid keys: {', '.join(cls.field_names())}")
        return cls(**values)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> TrainConfig:
        """A preset by name, with optional field overrides: `TrainConfig.from_name("stdlib", max_steps=50)`."""
        if name not in PRESETS:
            raise ValueError(f"unknown training preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name].to_dict(), **overrides})

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **overrides: Any) -> TrainConfig:
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

    def replace(self, **changes: Any) -> TrainConfig:
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
    allowed = _options(hint)
    for option in allowed:
        if option is type(None) and value is None:
            return
        if typing.get_origin(option) is tuple and isinstance(value, tuple | list):
            if all(isinstance(item, typing.get_args(option)[0]) for item in value):
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
        "none" if option is type(None) else "str" if typing.get_origin(option) is Literal
        else "a list of str" if typing.get_origin(option) is tuple else option.__name__
        for option in allowed
    )  # fmt: skip
    raise ValueError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")


def _check_preset(name: Any) -> str:
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown training preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return name


def _toml_value(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    return repr(value)


def parse_override(assignment: str) -> tuple[str, Any]:
    """'key=value' -> (key, raw value text); the key's dashes read as underscores. See `parse_overrides` for
    reading the value as the type of a config field."""
    key, sep, raw = assignment.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ValueError(f"override {assignment!r} is not KEY=VALUE (e.g. --set max_steps=200)")
    return key, raw.strip()


def parse_value(name: str, raw: str, hint: Any) -> Any:
    """The text of a `--set` value read as the type of a config field annotated `hint`: a TOML value ('12',
    '3e-4', 'true', '"x"', '["a", "b"]'), else the plain text ('cpu', 'out/run1'); 'none' / 'null' for an
    optional field; a bool also as yes/no/1/0; a tuple field also as comma-separated words. ValueError (naming
    the field and the type it wants) when the value does not fit.

    >>> parse_value("max_steps", "200", int), parse_value("device", "cpu", str), parse_value("seed", "7", int | None)
    (200, 'cpu', 7)
    """
    options = _options(hint)
    lowered = raw.strip().lower()
    if lowered in ("none", "null") and type(None) in options:
        return None
    if bool in options and lowered in _BOOL_WORDS:
        return _BOOL_WORDS[lowered]
    try:
        value: Any = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    if isinstance(value, list):
        value = tuple(value)
    if not _fits(value, hint):
        if _fits(raw.strip(), hint):
            value = raw.strip()  # e.g. sample_prompt=123: a str field keeps the text as written
        elif any(typing.get_origin(option) is tuple for option in options) and isinstance(value, str):
            value = tuple(word.strip() for word in value.split(",") if word.strip())
    _check_type(name, value, hint)
    return value


def parse_overrides(cls: type, assignments: Sequence[str], what: str = "config") -> dict[str, Any]:
    """`--set KEY=VALUE` assignments -> {field: value} for the dataclass `cls`, each value read as its field's
    type (`parse_value`). A dataclass-typed field takes dotted keys (`train.max_steps=5` -> {"train":
    {"max_steps": 5}}). An unknown key is a ValueError listing the valid ones (`what` names the config)."""
    fields = {field.name: field for field in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    unknown = []
    for assignment in assignments:
        key, raw = parse_override(assignment)
        head, dot, rest = key.partition(".")
        if head not in fields:
            unknown.append(key)
        elif dot and dataclasses.is_dataclass(hints[head]):
            nested = parse_overrides(hints[head], [f"{rest}={raw}"], what)
            values.setdefault(head, {}).update(nested)
        else:
            values[key] = parse_value(key, raw, hints[key])
    if unknown:
        raise ValueError(f"unknown {what} key(s) {unknown}; valid keys: {', '.join(fields)}")
    return values


_BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _options(hint: Any) -> tuple[Any, ...]:
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _fits(value: Any, hint: Any) -> bool:
    try:
        _check_type("", value, hint)
    except ValueError:
        return False
    return True


def load_config(source: str | os.PathLike[str] | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """The config of a preset name or a TOML file path (default: the "stdlib" preset), with 'key=value'
    overrides applied."""
    values = parse_overrides(TrainConfig, overrides or [], what="training config")
    if source is None:
        source = "stdlib"
    if str(source) in PRESETS:
        return TrainConfig.from_name(str(source), **values)
    if str(source).endswith(".toml") or Path(source).exists():
        return TrainConfig.from_toml(source, **values)
    raise ValueError(f"{str(source)!r} is neither a training preset ({', '.join(PRESETS)}) nor a TOML file")


PRESETS: dict[str, TrainConfig] = {
    # The main job: a small GPT-2 on this Python's standard library, with its own BPE, in a few CPU minutes.
    # Muon for 1000 steps reaches the val loss AdamW (learning_rate=2e-3) reached in 1800 in 0.54x the time, and
    # ends lower (docs/training.md); that recipe: optimizer=adamw max_steps=1800 learning_rate=2e-3.
    "stdlib": TrainConfig(
        data="stdlib", tokenizer="bpe", vocab_size=4096,
        model="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=128, dropout=0.0,
        optimizer="muon", muon_lr=0.02,
        batch_size=16, max_steps=1000, learning_rate=4e-3, warmup_steps=30, min_lr_ratio=0.1,
        weight_decay=0.1, beta2=0.99, eval_interval=200, eval_batches=8, checkpoint_interval=500,
        out_dir="out/stdlib", sample_prompt="def",  # "def " would end in a lone-space token, rare in training
    ),
    # nanoGPT's shakespeare-char CPU model, on UTF-8 bytes (the text is ASCII, so byte = character), trained with
    # Muon in half nanoGPT's 2000 steps (docs/training.md); nanoGPT's own recipe: optimizer=adamw max_steps=2000.
    "shakespeare-char": TrainConfig(
        data="tinyshakespeare.txt", tokenizer="bytes",
        model="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        optimizer="muon", muon_lr=0.02,
        batch_size=12, max_steps=1000, learning_rate=1e-3, warmup_steps=100, min_lr_ratio=0.1,
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
