"""An RL run: GRPO on the `Trainer`, with completions drawn by the serving engine from the policy itself.

`rl(config)` loads the policy (HF directory or Hub name) and its tokenizer, the prompts and the reward function,
and trains with the `Trainer` (its step, LR schedule, clipping, atomic checkpoints, `--resume`, Ctrl-C save and
trackers). The RL specifics are its pluggable parts:

- the batches, `GroupBatches`: each takes the next batch_prompts prompts (a seeded shuffle per epoch), samples
  num_generations completions of each with the engine from the current weights (`gpt2.rl.rollout`), scores them
  with the reward function and turns the rewards into group advantages; with num_iterations > 1 the same batch
  serves that many optimizer steps, against the log-probabilities it was sampled with;
- the loss, `GRPOObjective`: `gpt2.rl.loss.GRPOLoss`, whose figures (KL, clip fractions) join the batch's
  (reward mean and std, completion length) in metrics.jsonl and the trackers under TRL's names, through
  `RolloutMetrics`, a TrainerCallback.

Each completion's seed is a function of (seed, batch number, row), and the prompt order of (seed, epoch), so a
resumed run draws what an uninterrupted one would. The policy stays in eval mode: dropout off, so that the
completions are sampled from the distribution the loss scores. The output in out_dir is the trained model and
its tokenizer (HF format), metrics.jsonl, loss.png, reward.png (the reward per step and eval_reward) and
checkpoints/step_N.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn as nn

from gpt2.api import LLM
from gpt2.inference.generation import left_pad
from gpt2.model import GPT
from gpt2.rl.config import RLConfig
from gpt2.rl.loss import GRPOLoss, RolloutBatch, completion_logprobs, group_advantages, nan_std
from gpt2.rl.rewards import PromptRow, RewardFunction, load_reward, read_prompts, score
from gpt2.rl.rollout import Completion, Rollouts
from gpt2.runtime.device import autocast, resolve_device, resolve_dtype
from gpt2.train.checkpoint import previous_checkpoint
from gpt2.train.distributed import Distributed
from gpt2.train.metrics import write_step_plot
from gpt2.train.optimizer import configure_optimizer
from gpt2.train.tracking import Tracking, require_trackers
from gpt2.train.trainer import Batch, LoopOptions, Placement, Trainer, TrainerCallback, TrainingData
from gpt2.weights import load_model


def completion_seed(seed: int, batch: int, row: int) -> int:
    """The sampling seed of completion `row` of batch number `batch`: a function of the three alone."""
    words = np.random.SeedSequence([seed, batch, row]).generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


class RolloutMetrics(TrainerCallback):
    """The RL figures of the last step (TRL's names), written as their own metrics.jsonl line after each step's
    line, so the trackers get them too."""

    def __init__(self) -> None:
        self.pending: dict[str, float] = {}

    def update(self, figures: dict[str, float]) -> None:
        self.pending.update(figures)

    def on_metrics(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if "loss" in record and self.pending:  # a step's line (not this callback's own)
            figures, self.pending = self.pending, {}
            trainer.write_metrics({"step": record["step"], **figures})


class GRPOObjective:
    """The Trainer's loss function: GRPOLoss of (model, batch), its figures handed to `metrics`."""

    def __init__(self, loss: GRPOLoss, metrics: RolloutMetrics) -> None:
        self.loss = loss
        self.metrics = metrics

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        output = self.loss(cast(GPT, model), RolloutBatch(*batch))
        figures = {"clip_ratio/low_mean": output.clip_low, "clip_ratio/high_mean": output.clip_high,
                   "clip_ratio/region_mean": output.clip_fraction}  # fmt: skip
        if self.loss.beta:
            figures["kl"] = output.kl
        self.metrics.update({name: float(value) for name, value in figures.items()})
        return output.loss


class GroupBatches:
    """The Trainer's batch source (a `BatchSource`): groups of completions sampled from the policy (module
    docstring). Its state (batch count, prompt position, the batch in use when num_iterations > 1) goes into
    every checkpoint."""

    def __init__(
        self,
        config: RLConfig,
        rows: list[PromptRow],
        reward: RewardFunction,
        rollouts: Rollouts,
        reference: GPT | None,
        metrics: RolloutMetrics,
    ) -> None:
        self.config, self.rows, self.reward, self.rollouts = config, rows, reward, rollouts
        self.policy, self.reference, self.metrics = rollouts.model, reference, metrics
        self.device = self.policy.transformer.wte.weight.device
        self.dtype = resolve_dtype(config.train.runtime.dtype, self.device)
        self.batches = 0  # batches sampled so far
        self.cursor = 0  # prompts taken so far (over epochs)
        self.served = 0  # optimizer steps the current batch has served
        self.current: RolloutBatch | None = None

    def next_batch(self) -> Batch:
        if self.current is None or self.served >= self.config.num_iterations:
            self.current, self.served = self._sample(), 0
        self.served += 1
        return tuple(self.current)

    def _next_rows(self) -> list[PromptRow]:
        taken = []
        for _ in range(self.config.batch_prompts):
            epoch, index = divmod(self.cursor, len(self.rows))
            order = np.random.default_rng([self.config.train.runtime.seed, epoch]).permutation(len(self.rows))
            taken.append(self.rows[int(order[index])])
            self.cursor += 1
        return taken

    def _sample(self) -> RolloutBatch:
        config, G = self.config, self.config.num_generations
        rows = [row for row in self._next_rows() for _ in range(G)]  # each prompt's G rows side by side
        seed = config.train.runtime.seed
        params = [config.sampling(completion_seed(seed, self.batches, i)) for i in range(len(rows))]
        self.batches += 1
        completions = self.rollouts.sample([row.ids for row in rows], params)
        rewards = torch.tensor(score(self.reward, rows, [c.text for c in completions],
                                     [c.token_ids for c in completions]))  # fmt: skip
        batch = self._tensors(rows, completions, group_advantages(rewards, G, config.scale_rewards))
        self.metrics.update(rollout_figures(rewards, completions, G))
        return batch

    def _tensors(self, rows: list[PromptRow], completions: list[Completion], advantages: torch.Tensor) -> RolloutBatch:
        """The batch as the loss takes it: prompts left-padded, completions right-padded (N rows)."""
        eot = self.rollouts.eot_token
        prompt_ids, prompt_mask = left_pad([row.ids for row in rows], pad_token_id=eot)  # (N, P)
        lengths = torch.tensor([len(c.token_ids) for c in completions])  # (N,)
        C = max(1, int(lengths.max()))
        completion_ids = torch.full((len(rows), C), eot, dtype=torch.long)  # (N, C), right-padded
        for i, completion in enumerate(completions):
            completion_ids[i, : lengths[i]] = torch.tensor(completion.token_ids, dtype=torch.long)
        real = (torch.arange(C) < lengths.unsqueeze(1)).long()  # (N, C) 1 on generated tokens
        completion_mask = real  # what the loss counts
        if self.config.mask_truncated_completions:
            truncated = torch.tensor([c.finish_reason == "length" for c in completions])
            completion_mask = real * (~truncated).long().unsqueeze(1)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1).to(self.device)
        attention_mask = torch.cat([prompt_mask, real], dim=1).to(self.device)
        empty = torch.empty(0, device=self.device)
        old = ref = empty
        with torch.no_grad(), autocast(self.device, self.dtype):
            if self.config.num_iterations > 1:  # later steps on this batch compare with the sampling policy
                old = completion_logprobs(self.policy, input_ids, attention_mask, C, self.config.temperature).float()
            if self.reference is not None:
                ref = completion_logprobs(self.reference, input_ids, attention_mask, C, self.config.temperature)
                ref = ref.float()
        return RolloutBatch(input_ids, attention_mask, completion_mask.to(self.device), advantages.to(self.device),
                            old, ref)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        keep = self.current is not None and self.served < self.config.num_iterations
        current = [t.cpu() for t in self.current] if keep and self.current is not None else None
        return {"batches": self.batches, "cursor": self.cursor, "served": self.served, "current": current}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches, self.cursor, self.served = int(state["batches"]), int(state["cursor"]), int(state["served"])
        current = state.get("current")
        self.current = RolloutBatch(*(t.to(self.device) for t in current)) if current is not None else None


class RewardEvaluation:
    """A Trainer evaluation: the mean reward of greedy completions of held-out prompts (eval_reward), drawn by the
    same engine. For an exact-answer reward it is the exact-match accuracy."""

    def __init__(self, config: RLConfig, rows: list[PromptRow], reward: RewardFunction, rollouts: Rollouts) -> None:
        self.rows, self.reward, self.rollouts = rows, reward, rollouts
        self.params = config.sampling(seed=0).replace(temperature=0.0, seed=None)

    def __call__(self, model: nn.Module, step: int) -> dict[str, Any]:
        completions = self.rollouts.sample([row.ids for row in self.rows], [self.params] * len(self.rows))
        rewards = score(self.reward, self.rows, [c.text for c in completions], [c.token_ids for c in completions])
        return {"eval_reward": float(torch.nanmean(torch.tensor(rewards, dtype=torch.float64)))}


def rollout_figures(rewards: torch.Tensor, completions: list[Completion], G: int) -> dict[str, float]:
    """A batch's figures, by TRL's names: reward mean and std (over scorable completions), the fraction of groups
    whose rewards are all equal (they teach nothing), completion lengths and the fraction cut at the cap."""
    lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)
    group_std = nan_std(rewards.view(-1, G), dim=1)
    return {
        "reward": float(torch.nanmean(rewards)),
        "reward_std": float(nan_std(rewards)),
        "frac_reward_zero_std": float(torch.isclose(group_std, torch.zeros_like(group_std)).float().mean()),
        "completions/mean_length": float(lengths.mean()),
        "completions/clipped_ratio": sum(c.finish_reason == "length" for c in completions) / len(completions),
    }


REWARD_PLOT_FILE = "reward.png"


def write_reward_plot(records: list[dict[str, Any]], path: Path) -> None:
    """A PNG of the mean reward of each step's completions and, where measured, eval_reward."""
    write_step_plot(records, path, ("reward", "reward (sampled)"), ("eval_reward", "eval_reward (greedy, held out)"),
                    "mean reward")  # fmt: skip


@dataclass
class RLResult:
    out_dir: Path
    step: int
    interrupted: bool
    """Ctrl-C: a checkpoint was saved; continue with resume=True."""
    first_reward: float
    last_reward: float
    eval_rewards: dict[int, float]
    """eval_reward by step (eval_prompts)."""


def rl(
    config: RLConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> RLResult:
    """Train `config.model` with GRPO (module docstring). resume: continue from the latest checkpoint in out_dir;
    overwrite: start again although out_dir holds checkpoints. stop_at_step: save and return after this step.
    Everything a user gives is checked before anything is written."""
    say = log or (lambda message: None)
    if not config.model or not config.prompts or not config.reward:
        raise ValueError("an RL run needs model, prompts and reward (--model, --prompts, --reward)")
    out = Path(config.out_dir)
    require_trackers(config.train.output.log_to)
    device = resolve_device(config.train.runtime.device)
    llm = LLM.load(config.model, device=device)
    policy, tokenizer = llm.model.eval(), llm.tokenizer  # eval: dropout off (module docstring)
    room = policy.config.block_size - config.max_completion_length
    if room < 1:
        raise ValueError(f"max_completion_length={config.max_completion_length} leaves no room for a prompt in the "
                         f"model's context of {policy.config.block_size} tokens; lower it")  # fmt: skip
    reward = load_reward(config.reward)
    rows = read_prompts(config.prompts, tokenizer, room)
    eval_rows = read_prompts(config.eval_prompts, tokenizer, room) if config.eval_prompts else []
    reference = load_model(config.model).to(device).eval().requires_grad_(False) if config.beta else None
    checkpoint = previous_checkpoint(out, resume, overwrite, Distributed())
    metrics = RolloutMetrics()
    train_config = config.training()
    optimizer = configure_optimizer(policy, train_config.optimizer, device)
    queue = max(config.batch_prompts * config.num_generations, len(eval_rows))
    with Rollouts(policy, tokenizer, max_batch=config.max_batch, max_queue=queue) as rollouts, \
            Tracking(train_config) as tracking:  # fmt: skip
        batches = GroupBatches(config, rows, reward, rollouts, reference, metrics)
        evaluations = [RewardEvaluation(config, eval_rows, reward, rollouts)] if eval_rows else []
        data = TrainingData(batches, loss_fn=GRPOObjective(config.loss(), metrics), tokenizer=tokenizer)
        loop = LoopOptions(end_step=stop_at_step, evaluations=evaluations, callbacks=[metrics, tracking], log=say)
        placement = Placement(device=device, dist=Distributed())  # one process: every rank would draw the same prompts
        trainer = Trainer(policy, optimizer, train_config, data, placement, loop)
        if checkpoint is not None:
            trainer.resume(checkpoint)  # copies into the policy's own tensors, which the engine reads
        say(f"GRPO on {len(rows)} prompts from {config.prompts}, {config.batch_prompts} x {config.num_generations} "
            f"completions per step, loss {config.loss_type}, beta {config.beta}, on {device}"
            + (f"; resuming at step {trainer.step}" if checkpoint is not None else ""))  # fmt: skip
        result = trainer.fit(progress=progress)
    records = trainer.metrics.records
    write_reward_plot(records, out / REWARD_PLOT_FILE)
    rewards = [r["reward"] for r in records if "reward" in r]
    return RLResult(out, trainer.step, result.interrupted, rewards[0] if rewards else math.nan,
                    rewards[-1] if rewards else math.nan,
                    {r["step"]: r["eval_reward"] for r in records if "eval_reward" in r})  # fmt: skip
