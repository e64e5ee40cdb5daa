"""The RL configuration: GRPO's settings under TRL's `GRPOConfig` names (num_generations, beta, epsilon,
epsilon_high, loss_type, scale_rewards, num_iterations, max_completion_length, temperature, top_p, top_k, ...), the
run's inputs (model, prompts, reward), and `train`, a whole `TrainConfig` for the optimizer, LR schedule, steps,
checkpoints, tracking, device and seed, with RL's defaults.

    >>> RLConfig.from_settings(["num_generations=4", "max_steps=20"], model="m", prompts="p.jsonl",
    ...                        reward="builtin:addition").train.schedule.max_steps
    20
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpt2.inference.sampling import GREEDY_BELOW_TEMPERATURE, SamplingParams
from gpt2.rl.loss import LOSS_TYPES, SCALE_REWARDS, GRPOLoss, LossType, ScaleRewards
from gpt2.train.config import TrainConfig, parse_override, parse_value

RL_TRAINING = TrainConfig.from_dict(dict(
    max_steps=100, learning_rate=1e-5, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.0, eval_interval=0,
    checkpoint_interval=50, out_dir="out/rl", sample_tokens=0,
))  # fmt: skip
"""RL's training defaults: a constant LR (TRL's is 1e-6 with a linear decay, for models much larger than GPT-2's),
no weight decay, no val loss. Its data, tokenizer, batch and model-shape fields are not used: the prompts, the
model and its tokenizer are RLConfig's; a step's batch is batch_prompts x num_generations completions."""


@dataclass(frozen=True)
class RLConfig:
    """An RL run (GRPO); every field, and every field of `train`, is settable with `--set KEY=VALUE` (a training key
    by its own name, e.g. max_steps=200, or as train.max_steps=200)."""

    model: str = ""
    """The policy to start from: an HF directory or Hub name (its tokenizer is loaded from the same place); also
    the frozen reference of the KL penalty."""
    prompts: str = ""
    """A JSONL file of {"prompt": ..., other fields} rows, or builtin:NAME (gpt2.rl.rewards.BUILTIN_TASKS)."""
    reward: str = ""
    """FILE.py:FUNCTION, or builtin:NAME."""
    eval_prompts: str = ""
    """Held-out prompts (a JSONL file or builtin:NAME:test) whose greedy completions' mean reward is measured at
    the start, every eval_interval steps and at the end (eval_reward; for an exact-answer reward: the accuracy)."""
    num_generations: int = 8
    """G: completions sampled per prompt, a group whose rewards give each other's baseline."""
    batch_prompts: int = 4
    """Prompts per step; a step trains on batch_prompts x num_generations completions."""
    max_completion_length: int = 64
    """Tokens a completion may have at most (and dr_grpo's constant denominator)."""
    temperature: float = 1.0
    """Sampling temperature; the log-probabilities are those of the logits divided by it, as TRL's."""
    top_p: float = 1.0
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    """Texts that end a completion (the end-of-text token always does)."""
    json_schema: str | None = None
    """A JSON schema (JSON text) every completion is drawn to match, through the server's grammar path (the
    `structured` extra); regex: a regular expression instead. The loss scores the tokens under the model's own
    distribution, without the grammar's mask, as TRL does with vLLM's guided decoding."""
    regex: str | None = None
    loss_type: LossType = "dapo"
    """grpo, bnpo, dr_grpo or dapo (gpt2.rl.loss): how the token losses are averaged. TRL's default: dapo."""
    beta: float = 0.0
    """Weight of the KL penalty to the starting model (0: none, and no reference model is kept)."""
    epsilon: float = 0.2
    """The ratio is clipped below at 1 - epsilon."""
    epsilon_high: float | None = None
    """... and above at 1 + epsilon_high (default: epsilon; DAPO recommends 0.28)."""
    scale_rewards: ScaleRewards = "group"
    """Advantages divided by the group's reward std ("group"), the batch's ("batch") or not at all ("none")."""
    num_iterations: int = 1
    """Optimizer steps on each batch of completions (mu); above 1 the ratio to the sampling policy departs from 1
    and the clip acts. max_steps counts optimizer steps."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term by the ratio (TRL's default; gpt2.rl.loss)."""
    mask_truncated_completions: bool = False
    """Leave completions cut at max_completion_length out of the loss (DAPO)."""
    max_batch: int = 64
    """Sequences the engine decodes together at most."""
    train: TrainConfig = RL_TRAINING
    """Optimizer (learning_rate, grad_clip, ...), schedule (max_steps, warmup_steps, ...), checkpoints
    (checkpoint_interval, keep_checkpoints), tracking (log_to, log_interval), device, dtype and seed."""

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            object.__setattr__(self, "train", RL_TRAINING.replace(**self.train))
        if isinstance(self.stop, list | str):
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        for name in ("num_generations", "batch_prompts", "max_completion_length", "num_iterations", "max_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be at least 2 (a group's baseline needs two completions), got "
                             f"{self.num_generations}")  # fmt: skip
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {self.loss_type!r}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {self.scale_rewards!r}")
        if not self.temperature >= GREEDY_BELOW_TEMPERATURE:
            raise ValueError(f"temperature must be at least {GREEDY_BELOW_TEMPERATURE} (RL samples), got "
                             f"{self.temperature}")  # fmt: skip
        if self.train.data.grad_accum_steps != 1 or self.train.data.total_batch_tokens is not None:
            raise ValueError("a step is one batch of completions: leave grad_accum_steps and total_batch_tokens "
                             "unset and raise batch_prompts instead")  # fmt: skip
        self.loss()  # beta, epsilon: validated there
        self.sampling(seed=0)  # top_p, top_k, stop: validated there

    @classmethod
    def from_settings(cls, assignments: Sequence[str], **values: Any) -> RLConfig:
        """A config from `--set KEY=VALUE` assignments, each read as its field's type, then `values` (by field
        name, already typed). A training key may be written bare (max_steps=5) or dotted (train.max_steps=5);
        an unknown key is a ValueError listing the valid ones."""
        own = {field.name for field in dataclasses.fields(cls)} - {"train"}
        hints, train_hints = typing.get_type_hints(cls), TrainConfig.key_hints()
        mine: dict[str, Any] = {}
        train: dict[str, Any] = {}
        for assignment in assignments:
            key, raw = parse_override(assignment)
            bare = key.removeprefix("train.")
            if key in own:
                mine[key] = parse_value(raw, hints[key])
            elif bare in train_hints:
                train[bare] = parse_value(raw, train_hints[bare])
            else:
                valid = sorted(own) + TrainConfig.field_names()
                raise ValueError(f"unknown RL setting {key!r}; valid: {', '.join(valid)}")
        for key, value in values.items():
            (mine if key in own else train)[key] = value
        return cls(**mine, train=RL_TRAINING.replace(**train))

    @property
    def out_dir(self) -> str:
        return self.train.output.out_dir

    def training(self) -> TrainConfig:
        """The Trainer's config: `train`, with eval_interval=0 read as "at the start and the end" when there are
        eval_prompts."""
        if self.eval_prompts and not self.train.evaluation.eval_interval:
            return self.train.replace(eval_interval=self.train.schedule.max_steps)
        return self.train

    def loss(self) -> GRPOLoss:
        return GRPOLoss(loss_type=self.loss_type, beta=self.beta, epsilon_low=self.epsilon,
                        epsilon_high=self.epsilon if self.epsilon_high is None else self.epsilon_high,
                        max_completion_length=self.max_completion_length, temperature=self.temperature,
                        use_bias_correction_kl=self.use_bias_correction_kl)  # fmt: skip

    def sampling(self, seed: int) -> SamplingParams:
        """How one completion is drawn (the server's SamplingParams), with its own seed."""
        return SamplingParams(max_tokens=self.max_completion_length, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, stop=self.stop, seed=seed, json_schema=self.json_schema,
                              regex=self.regex)  # fmt: skip
