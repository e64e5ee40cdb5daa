"""The training configuration: a frozen dataclass of sections (data, model, optimizer, schedule, evaluation,
output, runtime), each a small dataclass checked at construction from its annotations; named presets; TOML files
and `key=value` overrides by each setting's flat key (`max_steps`) or dotted key (`schedule.max_steps`). An
unknown key is an error that lists the valid ones.

    >>> TrainConfig.from_name("stdlib", max_steps=50).schedule.max_steps
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
from gpt2.config import GPTConfig, is_integer
from gpt2.runtime.device import DtypeName

DeviceName = str  # "auto", "cpu", "cuda", "cuda:1", ...
TokenizerSpec = str  # "bytes" (or "byte"), "bpe" (train one on the corpus), or a tokenizer directory / Hub name
Parallel = Literal["ddp", "fsdp"]
OptimizerImpl = Literal["auto", "fused", "foreach", "for-loop"]
OptimizerName = Literal["adamw", "muon"]
LRSchedule = Literal["cosine", "wsd"]
NSDtype = Literal["auto", "float32", "bfloat16"]

Tracker = Literal["tensorboard", "wandb"]


def setting(
    default: Any,
    *,
    flat: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A section field with its checks: bounds (checked when the value is set) and, where it differs from the
    field's name, the flat key that `--set`, TOML files and presets call it by."""
    checks = {"flat": flat, "ge": ge, "gt": gt, "lt": lt, "le": le}
    return dataclasses.field(default=default, metadata=checks)


class Section:
    """A group of settings, checked at construction from its annotations: the type (int, float, str, bool,
    `Literal[...]` members, `X | None`, a tuple of str) and the bounds `setting` gives."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            key = field.metadata.get("flat") or field.name
            if isinstance(value, list):  # a TOML / JSON list reads as a list
                value = tuple(value)
                object.__setattr__(self, field.name, value)
            _check_type(key, value, hints[field.name])
            _check_bounds(key, value, field.metadata)


@dataclass(frozen=True)
class DataConfig(Section):
    """What the run trains on and in what batches."""

    source: str = setting("stdlib", flat="data")
    """'stdlib' (the built-in corpus: this Python's standard library source), a text file or folder of text
    files (tokenized into OUT/data), or a folder prepared by `gpt2 prepare` (has manifest.json)."""
    tokenizer: TokenizerSpec = "bpe"
    """'bpe': train a byte-level BPE of `vocab_size` ids on the corpus; 'bytes': UTF-8 bytes (257 ids); or a
    tokenizer directory / Hub name (e.g. 'gpt2')."""
    vocab_size: int = setting(4096, ge=1)
    """Vocabulary size of the BPE trained when tokenizer='bpe' (ignored otherwise: the tokenizer decides)."""
    max_corpus_bytes: int | None = setting(None, ge=1)
    """Use only the first files of the corpus up to this many bytes (quick trials, tests); None = all of it."""
    val_fraction: float = setting(0.1, ge=0.0, lt=1.0)
    """The last fraction of the token stream held out as the val split (when this run tokenizes the data)."""
    batch_size: int = setting(16, ge=1)
    """Sequences per micro-step per process."""
    grad_accum_steps: int = setting(1, ge=1)
    """Micro-steps per optimizer step (ignored when total_batch_tokens is set)."""
    total_batch_tokens: int | None = setting(None, ge=1)
    """Tokens per optimizer step over all processes; grad_accum_steps is then derived as
    total_batch_tokens / (batch_size * block_size * world_size), which must divide exactly."""


@dataclass(frozen=True)
class ModelConfig(Section):
    """The model's shape: a GPTConfig preset with optional changes, or pretrained weights to start from."""

    name: str = setting("gpt2-mini", flat="model")
    """Model shape preset from gpt2.config.PRESETS; the fields below override it when set."""
    n_layer: int | None = setting(None, ge=1)
    n_head: int | None = setting(None, ge=1)
    n_embd: int | None = setting(None, ge=1)
    block_size: int | None = setting(None, ge=1)
    """Context length used for training (also the model's number of positions)."""
    dropout: float | None = None
    init_from: str | None = None
    """Start from pretrained weights instead of random ones (nanoGPT's init_from): a model directory, a Hub name
    such as 'gpt2', OpenAI's TF release or an llm.c .bin file. The run then uses that model's tokenizer and shape
    (`tokenizer`, `model`, n_layer, n_head, n_embd are not used); block_size may shorten its context, and
    dropout may be set."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.name not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {self.name!r}; choose one of: {', '.join(MODEL_PRESETS)}")

    def shape(self, vocab_size: int) -> GPTConfig:
        """The GPTConfig of this shape for a tokenizer of `vocab_size` ids."""
        overrides = {
            name: getattr(self, name)
            for name in ("n_layer", "n_head", "n_embd", "block_size", "dropout")
            if getattr(self, name) is not None
        }
        return GPTConfig.from_name(self.name, vocab_size=vocab_size, **overrides)


@dataclass(frozen=True)
class OptimizerConfig(Section):
    """AdamW, or Muon for the blocks' matrices with AdamW for the rest."""

    name: OptimizerName = setting("adamw", flat="optimizer")
    """'adamw': AdamW for every parameter (GPT-2's recipe). 'muon': Muon for the transformer blocks' 2-D weights
    (muon_* settings), AdamW (learning_rate, betas, weight_decay) for embeddings, the tied head, biases and
    LayerNorm gains."""
    learning_rate: float = setting(6e-4, gt=0.0)
    """Peak learning rate, reached at the end of warmup."""
    weight_decay: float = setting(0.1, ge=0.0)
    """Applied to the 2-D parameters (matmul weights, embeddings) only; biases and LayerNorm gains get 0."""
    beta1: float = setting(0.9, ge=0.0, lt=1.0)
    beta2: float = setting(0.95, ge=0.0, lt=1.0)
    eps: float = setting(1e-8, gt=0.0)
    grad_clip: float = setting(1.0, ge=0.0)
    """Clip the global gradient norm to this; 0 disables clipping."""
    impl: OptimizerImpl = setting("auto", flat="optimizer_impl")
    """AdamW implementation: 'auto' = fused where available (CUDA, and CPU), else foreach."""
    muon_lr: float = setting(0.02, gt=0.0)
    """optimizer='muon': the Muon matrices' peak LR (scaled by sqrt(max(1, out/in)) per matrix), on the same
    schedule as learning_rate."""
    muon_momentum: float = setting(0.95, ge=0.0, lt=1.0)
    """Muon's (Nesterov) momentum."""
    muon_momentum_warmup_steps: int = setting(0, ge=0)
    """Raise Muon's momentum linearly from 0.85 to muon_momentum over this many steps (0 = none)."""
    muon_weight_decay: float = setting(0.0, ge=0.0)
    """Decoupled weight decay of the Muon matrices (W <- W * (1 - lr * wd))."""
    muon_ns_steps: int = setting(5, ge=1, le=20)
    """Newton-Schulz iterations per step."""
    muon_ns_dtype: NSDtype = "auto"
    """dtype of the Newton-Schulz iterations: 'auto' = bfloat16 on CUDA and on CPUs that multiply it fast (AMX, or
    AMD's AVX512-BF16: 2.2x float32's speed at the char-Shakespeare shape), float32 on other CPUs."""
    muon_compile: bool = False
    """torch.compile the Newton-Schulz iterations."""


@dataclass(frozen=True)
class ScheduleConfig(Section):
    """How long the run is and how its learning rate moves: linear warmup, then cosine or warmup-stable-decay."""

    max_steps: int = setting(1000, ge=1)
    """Optimizer steps; the LR decay ends here."""
    warmup_steps: int = setting(100, ge=0)
    min_lr_ratio: float = setting(0.1, ge=0.0, le=1.0)
    """The learning rate decays to learning_rate * min_lr_ratio."""
    lr_schedule: LRSchedule = "cosine"
    """After warmup: 'cosine' decay to the floor at max_steps; 'wsd' = hold the peak, then decay linearly to the
    floor over the last decay_fraction of max_steps."""
    decay_fraction: float = setting(0.2, gt=0.0, le=1.0)
    """lr_schedule='wsd': the fraction of max_steps spent decaying."""


@dataclass(frozen=True)
class EvaluationConfig(Section):
    """What is measured during the run, and the sample printed at its end."""

    eval_interval: int = setting(100, ge=0)
    """Evaluate on the val split every this many steps (and at the first and last step); 0 = never."""
    eval_batches: int = setting(20, ge=1)
    """Batches per evaluation (per process)."""
    hellaswag_file: str | None = None
    """A HellaSwag JSONL file (the official format); when set, completion-style HellaSwag accuracy is measured at
    every evaluation (see eval_interval) and written to metrics.jsonl as hellaswag_acc / hellaswag_acc_norm."""
    hellaswag_limit: int | None = setting(200, ge=1)
    """HellaSwag examples per evaluation, from the start of the file (None = all of them)."""
    sample_prompt: str = "def "
    sample_tokens: int = setting(200, ge=0)
    """Tokens to generate after training (0 = no sample)."""
    sample_temperature: float = setting(0.8, ge=0.0)
    sample_top_k: int | None = setting(50, ge=1)


@dataclass(frozen=True)
class OutputConfig(Section):
    """Where the run writes: checkpoints, metrics.jsonl and the experiment trackers."""

    out_dir: str = "out/stdlib"
    checkpoint_interval: int = setting(500, ge=0)
    """Save a training checkpoint every this many steps (and always at the end); 0 = only at the end."""
    keep_checkpoints: int = setting(2, ge=1)
    """How many of the most recent checkpoints to keep."""
    log_interval: int = setting(1, ge=1)
    """Write a metrics line every this many steps."""
    log_to: tuple[Tracker, ...] = ()
    """Experiment trackers that receive what metrics.jsonl gets (losses, LR, grad norm, tokens/s, MFU,
    evaluations) plus the config and the sample: any of 'tensorboard' (event files in OUT/tensorboard), 'wandb'
    (offline run in OUT/wandb, no account needed). Each needs its extra: pip install 'gpt2-faithful[NAME]'."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.out_dir:
            raise ValueError("out_dir must not be empty; pass out_dir=DIR")


@dataclass(frozen=True)
class RuntimeConfig(Section):
    """Where and how the steps run."""

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
    seed: int = setting(1337, ge=0)


SECTIONS: dict[str, type[Section]] = {
    "data": DataConfig, "model": ModelConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig,
    "evaluation": EvaluationConfig, "output": OutputConfig, "runtime": RuntimeConfig,
}  # fmt: skip
"""TrainConfig's sections, in the order TOML files and train_config.json write them."""


def _flat_keys() -> dict[str, tuple[str, str]]:
    """flat key -> (section, field): every setting by the one name the README and docs/training.md use."""
    keys = {}
    for section, cls in SECTIONS.items():
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            keys[field.metadata.get("flat") or field.name] = (section, field.name)
    return keys


FLAT_KEYS = _flat_keys()


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs, in sections, each validated at construction. Every setting has a flat
    key (`max_steps`, `optimizer`, `log_to`: what `--set`, presets and TOML files use) and a dotted one
    (`schedule.max_steps`, `optimizer.name`). Presets in `PRESETS`; `TrainConfig.from_dict({"max_steps": 50})`
    builds one from keys; `TrainConfig.from_toml(path, **overrides)` reads a TOML file of flat keys and / or
    `[section]` tables, plus optionally `preset = "name"` to start from a preset.
    """

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    evaluation: EvaluationConfig = dataclasses.field(default_factory=EvaluationConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        for section, cls in SECTIONS.items():
            if not isinstance(getattr(self, section), cls):
                raise ValueError(f"TrainConfig.{section} must be a {cls.__name__}; build configs with from_dict")
        if self.data.tokenizer == "bpe" and self.data.vocab_size < 257:
            raise ValueError(f"vocab_size must be at least 257 (256 bytes + <|endoftext|>), got {self.data.vocab_size}")
        self.model_config(vocab_size=257)  # the model overrides must make a valid GPTConfig (n_embd % n_head, ...)

    # ---------------------------------------------------------------------------------- construction
    @classmethod
    def field_names(cls) -> list[str]:
        """Every flat key."""
        return list(FLAT_KEYS)

    @classmethod
    def key_hints(cls) -> dict[str, Any]:
        """The type annotation of every accepted key, flat (`max_steps`) and dotted (`schedule.max_steps`)."""
        hints: dict[str, Any] = {}
        for flat, (section, name) in FLAT_KEYS.items():
            hint = typing.get_type_hints(SECTIONS[section])[name]
            hints[flat] = hints[f"{section}.{name}"] = hint
        return hints

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """A config from plain values by flat key (`max_steps`), dotted key (`schedule.max_steps`) or as nested
        sections (`{"schedule": {"max_steps": 5}}`, what `to_dict` writes); unset settings keep their defaults.
        An unknown key is a ValueError that lists the valid ones."""
        sections: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for (section, name), value in _by_section(values).items():
            sections[section][name] = value
        built: dict[str, Any] = {section: SECTIONS[section](**kwargs) for section, kwargs in sections.items()}
        return cls(**built)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> TrainConfig:
        """A preset by name, with optional overrides by key: `TrainConfig.from_name("stdlib", max_steps=50)`."""
        if name not in PRESETS:
            raise ValueError(f"unknown training preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return PRESETS[name].replace(**overrides)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **overrides: Any) -> TrainConfig:
        """Read a TOML file of config keys (flat, or in `[section]` tables; optionally `preset = "name"` as the
        starting point), then apply `overrides`. Unknown keys are an error listing the valid ones."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"training config file {str(path)!r} does not exist")
        try:
            values = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path} is not valid TOML: {err}") from err
        preset = values.pop("preset", None)
        base = PRESETS[_check_preset(preset)] if preset is not None else cls()
        return base.replace(**values).replace(**overrides)

    def replace(self, **changes: Any) -> TrainConfig:
        """This config with `changes` by flat key (or whole sections as tables of their fields)."""
        merged = {**_by_section(self.to_flat()), **_by_section(changes)}
        return self.from_dict({f"{section}.{name}": value for (section, name), value in merged.items()})

    def to_dict(self) -> dict[str, Any]:
        """The config as nested sections of plain values (what train_config.json holds)."""
        return dataclasses.asdict(self)

    def to_flat(self) -> dict[str, Any]:
        """The config by flat key."""
        return {flat: getattr(getattr(self, section), name) for flat, (section, name) in FLAT_KEYS.items()}

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


def _by_section(values: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """{flat key, dotted key or section: value or table} -> {(section, field): value}; unknown keys are refused."""
    found: dict[tuple[str, str], Any] = {}
    unknown = []
    for key, value in values.items():
        section, dot, name = key.partition(".")
        if not dot and section in SECTIONS and isinstance(value, dict):
            found.update(_by_section({f"{section}.{name}": inner for name, inner in value.items()}))
        elif not dot and key in FLAT_KEYS:
            found[FLAT_KEYS[key]] = value
        elif dot and section in SECTIONS and name in {f.name for f in dataclasses.fields(SECTIONS[section])}:  # type: ignore[arg-type]
            found[(section, name)] = value
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"unknown training config key(s) {unknown}; valid keys: {', '.join(FLAT_KEYS)}")
    return found


def _check_type(name: str, value: Any, hint: Any) -> None:
    """A ValueError unless `value` fits the annotation `hint` (int, float, str, bool, Literal members, a tuple of
    them, X | None), naming the setting and, for a Literal, the values it allows."""
    allowed = _options(hint)
    for option in allowed:
        if option is type(None) and value is None:
            return
        if typing.get_origin(option) is tuple and isinstance(value, tuple | list):
            if all(_fits(item, typing.get_args(option)[0]) for item in value):
                return
        if typing.get_origin(option) is Literal and value in typing.get_args(option):
            return
        if option is bool and isinstance(value, bool):
            return
        if option is int and is_integer(value):
            return
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if option is str and isinstance(value, str):
            return
    members = [
        member for option in allowed if typing.get_origin(option) is Literal for member in typing.get_args(option)
    ]
    items = [typing.get_args(option)[0] for option in allowed if typing.get_origin(option) is tuple]
    if members and isinstance(value, str):
        raise ValueError(f"{name} must be one of {tuple(members)}, got {value!r}")
    if items and isinstance(value, tuple | list):
        for item in value:
            _check_type(name, item, items[0])
    expected = " or ".join(
        "none" if option is type(None) else "str" if typing.get_origin(option) is Literal
        else "a list of str" if typing.get_origin(option) is tuple else option.__name__
        for option in allowed
    )  # fmt: skip
    raise ValueError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")


def _check_bounds(name: str, value: Any, bounds: Any) -> None:
    """A ValueError unless the number `value` lies within the bounds `setting` gave (None passes)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    ge, gt, lt, le = (bounds.get(key) for key in ("ge", "gt", "lt", "le"))
    low = "" if ge is None and gt is None else f"{'[' if ge is not None else '('}{ge if ge is not None else gt}"
    high = "" if lt is None and le is None else f"{lt if lt is not None else le}{')' if lt is not None else ']'}"
    if (
        (ge is not None and value < ge)
        or (gt is not None and value <= gt)
        or (lt is not None and value >= lt)
        or (le is not None and value > le)
    ):
        if low and high:
            raise ValueError(f"{name} must be in {low}, {high}, got {value}")
        if ge == 1 and isinstance(value, int):
            raise ValueError(f"{name} must be a positive integer, got {value}")
        bound = (
            f">= {ge}"
            if ge is not None
            else f"> {gt}"
            if gt is not None
            else f"< {lt}"
            if lt is not None
            else f"<= {le}"
        )
        raise ValueError(f"{name} must be {bound}, got {value}")


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
    hints = cls.key_hints() if cls is TrainConfig else typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    unknown = []
    for assignment in assignments:
        key, raw = parse_override(assignment)
        head, dot, rest = key.partition(".")
        if key not in hints and not (dot and dataclasses.is_dataclass(hints.get(head))):
            unknown.append(key)
        elif key not in hints:
            nested = parse_overrides(hints[head], [f"{rest}={raw}"], what)
            values.setdefault(head, {}).update(nested)
        else:
            values[key] = parse_value(key, raw, hints[key])
    if unknown:
        valid = TrainConfig.field_names() if cls is TrainConfig else [field.name for field in dataclasses.fields(cls)]
        raise ValueError(f"unknown {what} key(s) {unknown}; valid keys: {', '.join(valid)}")
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
    # Muon for 1000 steps reaches the val loss an AdamW recipe (optimizer=adamw max_steps=1800 learning_rate=2e-3)
    # reaches in 1800, in about half the time, and ends lower (docs/training.md;
    # benchmarks/train/time_to_loss.py re-derives it).
    "stdlib": TrainConfig.from_dict(dict(
        data="stdlib", tokenizer="bpe", vocab_size=4096,
        model="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=128, dropout=0.0,
        optimizer="muon", muon_lr=0.02,
        batch_size=16, max_steps=1000, learning_rate=4e-3, warmup_steps=30, min_lr_ratio=0.1,
        weight_decay=0.1, beta2=0.99, eval_interval=200, eval_batches=8, checkpoint_interval=500,
        out_dir="out/stdlib", sample_prompt="def",  # "def " would end in a lone-space token, rare in training
    )),
    # nanoGPT's shakespeare-char CPU model, on UTF-8 bytes (the text is ASCII, so byte = character), trained with
    # Muon in half nanoGPT's 2000 steps (docs/training.md); nanoGPT's own recipe: optimizer=adamw max_steps=2000.
    "shakespeare-char": TrainConfig.from_dict(dict(
        data="tinyshakespeare.txt", tokenizer="bytes",
        model="gpt2-mini", n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        optimizer="muon", muon_lr=0.02,
        batch_size=12, max_steps=1000, learning_rate=1e-3, warmup_steps=100, min_lr_ratio=0.1,
        weight_decay=0.1, beta2=0.99, eval_interval=250, eval_batches=20, checkpoint_interval=1000,
        out_dir="out/shakespeare-char", sample_prompt="ROMEO:", sample_tokens=300,
    )),
    # GPT-2 124M reproduction (llm.c / build-nanogpt): ~0.5M tokens per step, 10B tokens of FineWeb.
    "gpt2-124m": TrainConfig.from_dict(dict(
        data="data/fineweb10B", tokenizer="gpt2",
        model="gpt2", block_size=1024, dropout=0.0,
        batch_size=32, total_batch_tokens=524_288, max_steps=19_073, learning_rate=6e-4, warmup_steps=715,
        min_lr_ratio=0.1, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
        eval_interval=250, eval_batches=20, checkpoint_interval=2000, keep_checkpoints=3,
        out_dir="out/gpt2-124m", sample_prompt="Hello, I'm a language model,", sample_top_k=50,
        compile=True,
    )),
}  # fmt: skip
