"""The training configuration: a frozen dataclass of sections (data, model, optimizer, schedule, evaluation,
output, runtime), each a small pydantic dataclass whose annotations and `Field` bounds are its checks; named
presets; TOML files of `[section]` tables and `--set section.field=value` overrides.

Every setting is spelled `section.field` (`schedule.max_steps`); `ALIASES` maps the older flat keys
(`max_steps`) onto those, and `load_config` says in one line when a file or `--set` uses one. A bad value or an
unknown key is a `ConfigError` of one line per problem, naming the key, the value and what it accepts.

    >>> TrainConfig.from_name("stdlib", **{"schedule.max_steps": 50}).schedule.max_steps
    50
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

from gpt2.config import PRESETS as MODEL_PRESETS
from gpt2.config import GPTConfig
from gpt2.runtime.device import DtypeName

INT64_END = 2**63  # torch takes counts, sizes and seeds as 64-bit integers: each is below this
# Strict: an int field refuses True and 3.0, a bool field refuses "yes" (`--set` reads yes/no itself)
# `lt`, not `le`: pydantic keeps one bound of each name, and a field's own `le` (muon_ns_steps) must still apply
Integer = Annotated[int, Strict(), Field(lt=INT64_END)]
Number = Annotated[float, Strict()]  # an int is a number too; NaN and infinity are refused (allow_inf_nan)
Flag = Annotated[bool, Strict()]
DeviceName = str  # "auto", "cpu", "cuda", "cuda:1", ...
TokenizerSpec = str  # "bytes" (or "byte"), "bpe" (train one on the corpus), or a tokenizer directory / Hub name
Parallel = Literal["ddp", "fsdp"]
OptimizerImpl = Literal["auto", "fused", "foreach", "for-loop"]
OptimizerName = Literal["adamw", "muon"]
LRSchedule = Literal["cosine", "wsd"]
NSDtype = Literal["auto", "float32", "bfloat16"]
Tracker = Literal["tensorboard", "wandb"]

SECTION = ConfigDict(extra="forbid", allow_inf_nan=False)
"""Every section: an unknown field is an error, a float must be finite."""


class ConfigError(ValueError):
    """A training config that cannot be built: one line per problem, each naming its `section.field` key."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True, config=SECTION)
class DataConfig:
    """What the run trains on and in what batches."""

    source: str = "stdlib"
    """'stdlib' (the built-in corpus: this Python's standard library source), a text file or folder of text
    files (tokenized into OUT/data), or a folder prepared by `gpt2 prepare` (has manifest.json)."""
    tokenizer: TokenizerSpec = "bpe"
    """'bpe': train a byte-level BPE of `vocab_size` ids on the corpus; 'bytes': UTF-8 bytes (257 ids); or a
    tokenizer directory / Hub name (e.g. 'gpt2')."""
    vocab_size: Integer = Field(default=4096, ge=1)
    """Vocabulary size of the BPE trained when tokenizer='bpe' (ignored otherwise: the tokenizer decides)."""
    max_corpus_bytes: Integer | None = Field(default=None, ge=1)
    """Use only the first files of the corpus up to this many bytes (quick trials, tests); None = all of it."""
    val_fraction: Number = Field(default=0.1, ge=0.0, lt=1.0)
    """The last fraction of the token stream held out as the val split (when this run tokenizes the data)."""
    batch_size: Integer = Field(default=16, ge=1)
    """Sequences per micro-step per process."""
    grad_accum_steps: Integer = Field(default=1, ge=1)
    """Micro-steps per optimizer step (ignored when total_batch_tokens is set)."""
    total_batch_tokens: Integer | None = Field(default=None, ge=1)
    """Tokens per optimizer step over all processes; grad_accum_steps is then derived as
    total_batch_tokens / (batch_size * block_size * world_size), which must divide exactly."""


@dataclass(frozen=True, config=SECTION)
class ModelConfig:
    """The model's shape: a GPTConfig preset with optional changes, or pretrained weights to start from."""

    name: str = "gpt2-mini"
    """Model shape preset from gpt2.config.PRESETS; the fields below override it when set."""
    n_layer: Integer | None = Field(default=None, ge=1)
    n_head: Integer | None = Field(default=None, ge=1)
    n_embd: Integer | None = Field(default=None, ge=1)
    block_size: Integer | None = Field(default=None, ge=1)
    """Context length used for training (also the model's number of positions)."""
    dropout: Number | None = Field(default=None, ge=0.0, lt=1.0)
    init_from: str | None = None
    """Start from pretrained weights instead of random ones (nanoGPT's init_from): a model directory, a Hub name
    such as 'gpt2', OpenAI's TF release or an llm.c .bin file. The run then uses that model's tokenizer and shape
    (`data.tokenizer`, `model.name`, n_layer, n_head, n_embd are not used); block_size may shorten its context, and
    dropout may be set."""

    @field_validator("name")
    @classmethod
    def _a_preset(cls, name: str) -> str:
        if name not in MODEL_PRESETS:
            raise ValueError(f"must be one of {', '.join(map(repr, MODEL_PRESETS))}")
        return name

    def shape(self, vocab_size: int) -> GPTConfig:
        """The GPTConfig of this shape for a tokenizer of `vocab_size` ids."""
        overrides = {
            name: getattr(self, name)
            for name in ("n_layer", "n_head", "n_embd", "block_size", "dropout")
            if getattr(self, name) is not None
        }
        return GPTConfig.from_name(self.name, vocab_size=vocab_size, **overrides)


@dataclass(frozen=True, config=SECTION)
class OptimizerConfig:
    """AdamW, or Muon for the blocks' matrices with AdamW for the rest."""

    name: OptimizerName = "adamw"
    """'adamw': AdamW for every parameter (GPT-2's recipe). 'muon': Muon for the transformer blocks' 2-D weights
    (muon_* settings), AdamW (learning_rate, betas, weight_decay) for embeddings, the tied head, biases and
    LayerNorm gains."""
    learning_rate: Number = Field(default=6e-4, gt=0.0)
    """Peak learning rate, reached at the end of warmup."""
    weight_decay: Number = Field(default=0.1, ge=0.0)
    """Applied to the 2-D parameters (matmul weights, embeddings) only; biases and LayerNorm gains get 0."""
    beta1: Number = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: Number = Field(default=0.95, ge=0.0, lt=1.0)
    eps: Number = Field(default=1e-8, gt=0.0)
    grad_clip: Number = Field(default=1.0, ge=0.0)
    """Clip the global gradient norm to this; 0 disables clipping."""
    impl: OptimizerImpl = "auto"
    """AdamW implementation: 'auto' = fused where available (CUDA, and CPU), else foreach."""
    muon_lr: Number = Field(default=0.02, gt=0.0)
    """name='muon': the Muon matrices' peak LR (scaled by sqrt(max(1, out/in)) per matrix), on the same
    schedule as learning_rate."""
    muon_momentum: Number = Field(default=0.95, ge=0.0, lt=1.0)
    """Muon's (Nesterov) momentum."""
    muon_momentum_warmup_steps: Integer = Field(default=0, ge=0)
    """Raise Muon's momentum linearly from 0.85 to muon_momentum over this many steps (0 = none)."""
    muon_weight_decay: Number = Field(default=0.0, ge=0.0)
    """Decoupled weight decay of the Muon matrices (W <- W * (1 - lr * wd))."""
    muon_ns_steps: Integer = Field(default=5, ge=1, le=20)
    """Newton-Schulz iterations per step."""
    muon_ns_dtype: NSDtype = "auto"
    """dtype of the Newton-Schulz iterations: 'auto' = bfloat16 on CUDA and on CPUs that multiply it fast (AMX, or
    AMD's AVX512-BF16: 2.2x float32's speed at the char-Shakespeare shape), float32 on other CPUs."""
    muon_compile: Flag = False
    """torch.compile the Newton-Schulz iterations."""


@dataclass(frozen=True, config=SECTION)
class ScheduleConfig:
    """How long the run is and how its learning rate moves: linear warmup, then cosine or warmup-stable-decay."""

    max_steps: Integer = Field(default=1000, ge=1)
    """Optimizer steps; the LR decay ends here."""
    warmup_steps: Integer = Field(default=100, ge=0)
    min_lr_ratio: Number = Field(default=0.1, ge=0.0, le=1.0)
    """The learning rate decays to learning_rate * min_lr_ratio."""
    lr_schedule: LRSchedule = "cosine"
    """After warmup: 'cosine' decay to the floor at max_steps; 'wsd' = hold the peak, then decay linearly to the
    floor over the last decay_fraction of max_steps."""
    decay_fraction: Number = Field(default=0.2, gt=0.0, le=1.0)
    """lr_schedule='wsd': the fraction of max_steps spent decaying."""


@dataclass(frozen=True, config=SECTION)
class EvaluationConfig:
    """What is measured during the run, and the sample printed at its end."""

    eval_interval: Integer = Field(default=100, ge=0)
    """Evaluate on the val split every this many steps (and at the first and last step); 0 = never."""
    eval_batches: Integer = Field(default=20, ge=1)
    """Batches per evaluation (per process)."""
    hellaswag_file: str | None = None
    """A HellaSwag JSONL file (the official format); when set, completion-style HellaSwag accuracy is measured at
    every evaluation (see eval_interval) and written to metrics.jsonl as hellaswag_acc / hellaswag_acc_norm."""
    hellaswag_limit: Integer | None = Field(default=200, ge=1)
    """HellaSwag examples per evaluation, from the start of the file (None = all of them)."""
    sample_prompt: str = "def "
    sample_tokens: Integer = Field(default=200, ge=0)
    """Tokens to generate after training (0 = no sample)."""
    sample_temperature: Number = Field(default=0.8, ge=0.0)
    sample_top_k: Integer | None = Field(default=50, ge=1)


@dataclass(frozen=True, config=SECTION)
class OutputConfig:
    """Where the run writes: checkpoints, metrics.jsonl and the experiment trackers."""

    out_dir: str = Field(default="out/stdlib", min_length=1)
    checkpoint_interval: Integer = Field(default=500, ge=0)
    """Save a training checkpoint every this many steps (and always at the end); 0 = only at the end."""
    keep_checkpoints: Integer = Field(default=2, ge=1)
    """How many of the most recent checkpoints to keep."""
    log_interval: Integer = Field(default=1, ge=1)
    """Write a metrics line every this many steps."""
    log_to: tuple[Tracker, ...] = ()
    """Experiment trackers that receive what metrics.jsonl gets (losses, LR, grad norm, tokens/s, MFU,
    evaluations) plus the config and the sample: any of 'tensorboard' (event files in OUT/tensorboard), 'wandb'
    (offline run in OUT/wandb, no account needed). Each needs its extra: pip install 'gpt2-faithful[NAME]'."""


@dataclass(frozen=True, config=SECTION)
class RuntimeConfig:
    """Where and how the steps run."""

    device: DeviceName = "auto"
    """'auto' (CUDA when present, else CPU), or a torch device string such as 'cpu' or 'cuda:0'."""
    dtype: DtypeName = "auto"
    """Autocast dtype: 'auto' = bfloat16 on CUDA when supported (float16 + GradScaler otherwise); on a CPU
    bfloat16 where its bf16 matmuls beat float32 (AMX, or AVX512-BF16 on AMD), else float32. Parameters and optimizer
    state stay float32."""
    compile: Flag = False
    """torch.compile the model for training steps."""
    activation_checkpointing: Flag = False
    """Recompute each block's activations in the backward pass instead of keeping them (same loss and
    gradients, less memory, about a third more compute): for a batch_size that does not fit otherwise."""
    parallel: Parallel = "ddp"
    """Under torchrun (WORLD_SIZE > 1): 'ddp' replicates the model; 'fsdp' shards parameters, gradients and
    optimizer state (FSDP2 fully_shard per block) for models that do not fit one device."""
    seed: Integer = Field(default=1337, ge=0)


SECTIONS: dict[str, Any] = {  # name -> pydantic dataclass
    "data": DataConfig, "model": ModelConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig,
    "evaluation": EvaluationConfig, "output": OutputConfig, "runtime": RuntimeConfig,
}  # fmt: skip
"""TrainConfig's sections, in the order TOML files and train_config.json write them."""

KEYS: dict[str, tuple[str, str]] = {
    f"{section}.{name}": (section, name) for section, cls in SECTIONS.items() for name in cls.__pydantic_fields__
}
"""Every setting by its key, `section.field`."""

_RENAMED = {"data.source": "data", "model.name": "model", "optimizer.name": "optimizer",
            "optimizer.impl": "optimizer_impl"}  # fmt: skip
ALIASES: dict[str, str] = {_RENAMED.get(key, key.partition(".")[2]): key for key in KEYS}
"""The flat keys of the settings (`max_steps` -> `schedule.max_steps`), accepted where a key is: the field's
name, except `data`, `model`, `optimizer` and `optimizer_impl` (data.source, model.name, optimizer.name,
optimizer.impl). The table is docs/training.md's."""


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class TrainConfig:
    """Everything a training run needs, in sections, each validated at construction. Presets in `PRESETS`;
    `TrainConfig.from_dict({"schedule.max_steps": 50})` builds one from keys (or from nested sections, what
    `to_dict` writes); `TrainConfig.from_toml(path)` reads a TOML file of `[section]` tables, plus optionally
    `preset = "name"` to start from a preset. Where a key is taken, its flat alias is too (`ALIASES`).
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.data.tokenizer == "bpe" and self.data.vocab_size < 257:
            raise ValueError(
                f"data.vocab_size = {self.data.vocab_size}: must be at least 257 with data.tokenizer = 'bpe' "
                "(256 bytes + <|endoftext|>)"
            )
        try:  # the model overrides must make a valid GPTConfig (n_embd % n_head, ...)
            self.model_config(vocab_size=257)
        except ValueError as err:
            raise ValueError(f"model: {err}") from err
        return self

    # ---------------------------------------------------------------------------------- construction
    @classmethod
    def field_names(cls) -> list[str]:
        """Every key, `section.field`."""
        return list(KEYS)

    @classmethod
    def key_hints(cls) -> dict[str, Any]:
        """The type of every accepted key, dotted (`schedule.max_steps`) and flat (`max_steps`)."""
        hints = {key: typing.get_type_hints(SECTIONS[section])[name] for key, (section, name) in KEYS.items()}
        return {**hints, **{alias: hints[key] for alias, key in ALIASES.items()}}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """A config from plain values by key (`schedule.max_steps`), as nested sections (`{"schedule":
        {"max_steps": 5}}`, what `to_dict` writes) or by flat alias (`max_steps`); unset settings keep their
        defaults. A ConfigError names every unknown key and every value out of its type or range."""
        return cls()._with(values)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> TrainConfig:
        """A preset by name, with optional overrides by key: `TrainConfig.from_name("stdlib", max_steps=50)`."""
        return PRESETS[_preset(name)]._with(overrides)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **overrides: Any) -> TrainConfig:
        """Read a TOML file of `[section]` tables (optionally `preset = "name"` as the starting point), then apply
        `overrides`."""
        values = read_toml(path)
        preset = values.pop("preset", None)
        return (cls() if preset is None else PRESETS[_preset(preset)])._with(values, overrides)

    def replace(self, **changes: Any) -> TrainConfig:
        """This config with `changes` by key (flat aliases, or whole sections as tables of their fields)."""
        return self._with(changes)

    def _with(self, *layers: dict[str, Any]) -> TrainConfig:
        """This config with each layer of changes applied in turn, validated once: every problem is reported."""
        merged = self.to_dict()
        for layer in layers:
            for section, fields in _nested(layer).items():
                if section in SECTIONS:
                    merged[section].update(fields)
                else:
                    merged[section] = fields  # an unknown key, refused below by name
        try:
            return TrainConfig(**merged)
        except ValidationError as err:
            raise problems(err, TrainConfig) from None

    def to_dict(self) -> dict[str, Any]:
        """The config as nested sections of plain values (what train_config.json holds)."""
        return dataclasses.asdict(self)

    def to_flat(self) -> dict[str, Any]:
        """The config by flat alias (what the experiment trackers get)."""
        return {alias: getattr(getattr(self, KEYS[key][0]), KEYS[key][1]) for alias, key in ALIASES.items()}

    def to_toml(self) -> str:
        """The config as a TOML file of `[section]` tables that `from_toml` reads back (unset settings are
        written as comments)."""
        lines: list[str] = []
        for section, values in self.to_dict().items():
            lines.append(f"{'' if not lines else chr(10)}[{section}]")
            for name, value in values.items():
                lines.append(f"# {name} = (unset)" if value is None else f"{name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------------------------------- derived
    def model_config(self, vocab_size: int) -> GPTConfig:
        """The GPTConfig this run trains, for a tokenizer of `vocab_size` ids."""
        return self.model.shape(vocab_size)

    @property
    def min_lr(self) -> float:
        return self.optimizer.learning_rate * self.schedule.min_lr_ratio


def _nested(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{key, flat alias or section: value or table} -> {section: {field: value}}. A key that names no section
    is kept under its own name for the validation to refuse."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, dot, name = key.partition(".")
        if not dot and section in SECTIONS and isinstance(value, dict):
            nested.setdefault(section, {}).update(value)
        elif not dot and key in ALIASES:
            section, _, name = ALIASES[key].partition(".")
            nested.setdefault(section, {})[name] = value
        elif dot and section in SECTIONS:
            nested.setdefault(section, {})[name] = value
        elif key in SECTIONS:
            raise ConfigError([f"{key} = {_shown(value)}: must be a table of its settings ([{key}] in TOML)"])
        else:
            nested[key] = value
    return nested


def aliases_in(values: dict[str, Any]) -> list[str]:
    """The flat aliases among the keys of `values` (a section's table is not one)."""
    is_table = {key for key, value in values.items() if key in SECTIONS and isinstance(value, dict)}
    return [key for key in values if key in ALIASES and key not in is_table]


def alias_notice(aliases: Sequence[str]) -> str:
    """The one line that says which flat keys were read as which `section.field` keys."""
    spelled = ", ".join(f"{alias} is {ALIASES[alias]}" for alias in dict.fromkeys(aliases))
    return f"note: flat keys are aliases: {spelled}"


# ------------------------------------------------------------------------------------------ errors
def problems(err: ValidationError, root: type) -> ConfigError:
    """pydantic's errors from building the pydantic dataclass `root` as one line each: the key (`section.field`),
    the value and what the key accepts (a union's branches, each refused, make one line)."""
    return ConfigError(list(dict.fromkeys(_problem(error, root) for error in err.errors())))


def _problem(error: Any, root: type) -> str:
    if error["type"] == "unexpected_keyword_argument":
        key = ".".join(str(part) for part in error["loc"])
        return unknown_key(key) if root is TrainConfig else f"unknown key {key}"
    path, info, owner = [], None, root
    for part in error["loc"]:  # fields, then a union's branch names or a list's item index
        fields = getattr(owner, "__pydantic_fields__", {})
        if part not in fields:
            break
        path.append(part)
        info, owner = fields[part], fields[part].annotation
    if info is None:  # a check of the whole config (model shape, vocab size)
        return str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
    items = [part for part in error["loc"] if isinstance(part, int)]
    shown = f"{'.'.join(path)}{''.join(f'[{item}]' for item in items)} = {_shown(error['input'])}"
    if error["type"] == "value_error":
        return f"{shown}: {error['ctx']['error']}"
    if items:  # an item of a list
        return f"{shown}: must be {_expected(typing.get_args(info.annotation)[0])}"
    return f"{shown}: must be {_expected(info.annotation, info.metadata)}"


def unknown_key(key: str, what: str = "training config", own: Sequence[str] = ()) -> str:
    """The line for an unknown key: the nearest key (in its section when it names one; a flat alias is named by
    its key), else the fields of its section, else the sections. `own`: the keys of a config that holds a
    training config besides its own (fine-tuning's)."""
    section, dot, name = key.partition(".")
    if dot and section in SECTIONS:
        fields = list(SECTIONS[section].__pydantic_fields__)
        close = [f"{section}.{match}" for match in difflib.get_close_matches(name, fields, n=1)]
        otherwise = f"[{section}] has {', '.join(fields)}"
    else:
        matches = difflib.get_close_matches(key, [*own, *KEYS, *ALIASES], n=1)
        close = [match if match in own else ALIASES.get(match, match) for match in matches]
        mine = f"one of {', '.join(own)}, or " if own else ""
        otherwise = f"a key is {mine}section.field, the sections: {', '.join(SECTIONS)}"
    return f"unknown {what} key {key}; {f'did you mean {close[0]}?' if close else otherwise}"


def _expected(hint: Any, metadata: Sequence[Any] = ()) -> str:
    """What a field of type `hint` (with pydantic's `metadata`: bounds, min length) accepts, in words."""
    metadata = list(metadata)
    while typing.get_origin(hint) is Annotated:  # an Optional's inner type keeps its own (a Field's: its metadata)
        hint, *extra = typing.get_args(hint)
        metadata += [bound for item in extra for bound in getattr(item, "metadata", [item])]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        words = [_expected(option, metadata) for option in options if option is not type(None)]
        return " or ".join(words) + (" or none" if type(None) in options else "")
    if typing.get_origin(hint) is Literal:
        return f"one of {', '.join(map(repr, typing.get_args(hint)))}"
    if typing.get_origin(hint) is tuple:
        return f"a list, each {_expected(typing.get_args(hint)[0])}"
    if hint is bool:
        return "true or false"
    if hint is str:
        return "a non-empty string" if _bound(metadata, "min_length") else "a string"
    kind = {int: "an integer", float: "a number"}.get(hint, getattr(hint, "__name__", str(hint)))
    return f"{kind}{_range(metadata)}"


def _range(metadata: Sequence[Any]) -> str:
    """' in [0.0, 1.0)', ' >= 1', ... from the bounds among pydantic's field metadata ('' when there are none)."""
    ge, gt, le, lt = (_bound(metadata, name) for name in ("ge", "gt", "le", "lt"))
    low = f"[{ge}" if ge is not None else f"({gt}" if gt is not None else ""
    high = f"{le}]" if le is not None else f"{'2**63' if lt == INT64_END else lt})" if lt is not None else ""
    if low and high:
        return f" in {low}, {high}"
    if low:
        return f" {'>=' if ge is not None else '>'} {low[1:]}"
    if high:
        return f" {'<=' if le is not None else '<'} {high[:-1]}"
    return ""


def _bound(metadata: Sequence[Any], name: str) -> Any:
    """The bound `name` (ge, gt, le, lt, min_length: annotated-types' attribute names) among `metadata`."""
    return next((getattr(item, name) for item in metadata if getattr(item, name, None) is not None), None)


def _shown(value: Any, limit: int = 40) -> str:
    """The value as written in a message; a huge one is cut (a 400-digit number, a pasted file)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 10]}... ({len(text)} characters)"


def _preset(name: Any) -> str:
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError([f"unknown training preset {_shown(name)}; choose one of: {', '.join(PRESETS)}"])
    return name


# ------------------------------------------------------------------------------------- files, --set
def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The values of a TOML config file, as parsed (tables, keys, `preset`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid TOML: {err}") from err


def _toml_value(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    return repr(value)


def parse_override(assignment: str) -> tuple[str, str]:
    """'key=value' -> (key, raw value text); the key's dashes read as underscores. See `parse_overrides` for
    reading the value as the type of a config field."""
    key, sep, raw = assignment.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ValueError(f"override {assignment!r} is not KEY=VALUE (e.g. --set schedule.max_steps=200)")
    return key, raw.strip()


def parse_value(raw: str, hint: Any) -> Any:
    """The text of a `--set` value read as the type `hint`: a TOML value ('12', '3e-4', 'true', '"x"', '["a",
    "b"]'), else the plain text ('cpu', 'out/run1'); 'none' / 'null' for an optional field; a bool also as
    yes/no/1/0; a tuple also as comma-separated words. When no reading has that type: the TOML reading (or the
    words, or the text), for the config's validation to refuse by name.

    >>> parse_value("200", int), parse_value("cpu", str), parse_value("none", int | None), parse_value("a,b", tuple)
    (200, 'cpu', None, ('a', 'b'))
    """
    text, lowered = raw.strip(), raw.strip().lower()
    words = tuple(word.strip() for word in text.split(",") if word.strip())
    readings: list[Any] = [None] if lowered in ("none", "null") else []
    if lowered in _BOOL_WORDS:
        readings.append(_BOOL_WORDS[lowered])
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        fallback = words if typing.get_origin(hint) is tuple else text
    else:
        fallback = tuple(value) if isinstance(value, list) else value
        readings.append(fallback)
    readings += [text, words]
    return next((reading for reading in readings if _fits(reading, hint)), fallback)


def parse_overrides(cls: type, assignments: Sequence[str], what: str = "config") -> dict[str, Any]:
    """`--set KEY=VALUE` assignments -> {key: value} for the config class `cls`, each value read as its key's
    type (`parse_value`), for the config's validation to report every problem at once. A config-typed field
    takes dotted keys (`train.max_steps=5` -> {"train": {"max_steps": 5}}). TrainConfig's unknown keys are left
    to its validation (which suggests the nearest); another class's are a ConfigError (`what` names it)."""
    if cls is TrainConfig:
        hints = cls.key_hints()
        return {key: parse_value(raw, hints.get(key, Any)) for key, raw in map(parse_override, assignments)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    unknown = []
    for assignment in assignments:
        key, raw = parse_override(assignment)
        head, dot, rest = key.partition(".")
        if key in hints and not dataclasses.is_dataclass(hints[key]):
            values[key] = parse_value(raw, hints[key])
        elif dot and dataclasses.is_dataclass(hints.get(head)):
            values.setdefault(head, {}).update(parse_overrides(hints[head], [f"{rest}={raw}"], what))
        else:
            unknown.append(key)
    if unknown:
        valid = [field.name for field in dataclasses.fields(cls)]
        raise ConfigError([f"unknown {what} key(s) {unknown}; valid keys: {', '.join(valid)}"])
    return values


_BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@functools.cache
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(hint, config=ConfigDict(strict=True))


def _fits(value: Any, hint: Any) -> bool:
    """Whether `value` has the type `hint` as it is (strict: no conversion), bounds aside."""
    try:
        _adapter(hint).validate_python(value)
    except ValidationError:
        return False
    return True


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def load_config(
    source: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    notice: Callable[[str], None] = _stderr,
) -> TrainConfig:
    """The config of a preset name or a TOML file path (default: the "stdlib" preset), with `--set`'s
    'key=value' overrides applied, validated once (a ConfigError lists every problem). A flat alias in the file
    or the overrides is read as its key, and `notice` gets one line that says so."""
    changes = parse_overrides(TrainConfig, overrides, what="training config")
    source = "stdlib" if source is None else source
    if str(source) in PRESETS:
        values: dict[str, Any] = {"preset": str(source)}
    elif str(source).endswith(".toml") or Path(source).exists():
        values = read_toml(source)
    else:
        raise ValueError(f"{str(source)!r} is neither a training preset ({', '.join(PRESETS)}) nor a TOML file")
    aliases = aliases_in(values) + aliases_in(changes)
    if aliases:
        notice(alias_notice(aliases))
    preset = values.pop("preset", None)
    return (TrainConfig() if preset is None else PRESETS[_preset(preset)])._with(values, changes)


PRESETS: dict[str, TrainConfig] = {
    # The main job: a small GPT-2 on this Python's standard library, with its own BPE, in a few CPU minutes.
    # Muon for 1000 steps reaches the val loss an AdamW recipe (optimizer.name=adamw schedule.max_steps=1800
    # optimizer.learning_rate=2e-3) reaches in 1800, in about half the time, and ends lower (docs/training.md;
    # benchmarks/train/time_to_loss.py re-derives it).
    "stdlib": TrainConfig.from_dict({
        "data": dict(source="stdlib", tokenizer="bpe", vocab_size=4096, batch_size=16),
        "model": dict(name="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=128, dropout=0.0),
        "optimizer": dict(name="muon", muon_lr=0.02, learning_rate=4e-3, weight_decay=0.1, beta2=0.99),
        "schedule": dict(max_steps=1000, warmup_steps=30, min_lr_ratio=0.1),
        # "def " would end in a lone-space token, rare in training
        "evaluation": dict(eval_interval=200, eval_batches=8, sample_prompt="def"),
        "output": dict(out_dir="out/stdlib", checkpoint_interval=500),
    }),
    # nanoGPT's shakespeare-char CPU model, on UTF-8 bytes (the text is ASCII, so byte = character), trained with
    # Muon in half nanoGPT's 2000 steps (docs/training.md); nanoGPT's own recipe: optimizer.name=adamw
    # schedule.max_steps=2000.
    "shakespeare-char": TrainConfig.from_dict({
        "data": dict(source="tinyshakespeare.txt", tokenizer="bytes", batch_size=12),
        "model": dict(name="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0),
        "optimizer": dict(name="muon", muon_lr=0.02, learning_rate=1e-3, weight_decay=0.1, beta2=0.99),
        "schedule": dict(max_steps=1000, warmup_steps=100, min_lr_ratio=0.1),
        "evaluation": dict(eval_interval=250, eval_batches=20, sample_prompt="ROMEO:", sample_tokens=300),
        "output": dict(out_dir="out/shakespeare-char", checkpoint_interval=1000),
    }),
    # GPT-2 124M reproduction (llm.c / build-nanogpt): ~0.5M tokens per step, 10B tokens of FineWeb.
    "gpt2-124m": TrainConfig.from_dict({
        "data": dict(source="data/fineweb10B", tokenizer="gpt2", batch_size=32, total_batch_tokens=524_288),
        "model": dict(name="gpt2", block_size=1024, dropout=0.0),
        "optimizer": dict(learning_rate=6e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0),
        "schedule": dict(max_steps=19_073, warmup_steps=715, min_lr_ratio=0.1),
        "evaluation": dict(eval_interval=250, eval_batches=20, sample_prompt="Hello, I'm a language model,",
                           sample_top_k=50),
        "output": dict(out_dir="out/gpt2-124m", checkpoint_interval=2000, keep_checkpoints=3),
        "runtime": dict(compile=True),
    }),
}  # fmt: skip
