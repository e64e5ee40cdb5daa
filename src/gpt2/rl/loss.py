"""GRPO's loss as TRL's `GRPOTrainer` defines it (`_compute_loss`), and the group-relative advantages it trains on
(`_generate_and_score_completions`), for our GPT.

Notation: N = prompts x G completions (a batch's rows), P = prompt columns (left-padded), C = completion columns
(right-padded), V = vocab_size.

Each row is a prompt and one of the G completions sampled for it. Its advantage is its reward minus the mean reward
of its group, divided by the group's standard deviation + 1e-4 (`scale_rewards`: "group"; "batch" divides by the
whole batch's, "none" by nothing). Each completion token t has the policy's log-probability log p(t) (of the logits
divided by the sampling temperature) and the one it had when sampled, log p_old(t): the ratio r = exp(log p -
log p_old) is clipped to [1 - epsilon_low, 1 + epsilon_high] and the token's loss is

    -min(r * A, clip(r) * A) + beta * (exp(log p_ref - log p) - (log p_ref - log p) - 1)

the second term being the k3 estimate of KL(p || p_ref) to the frozen reference model (only when beta > 0), times r
when use_bias_correction_kl (TRL's default: r is 1 in value on-policy, but its gradient makes the KL's gradient the
unbiased one of the reverse KL, as in DeepSeek-V3.2). The loss
types differ only in how the token losses of the batch are averaged:

- grpo: the mean over each completion's tokens, then the mean over completions;
- bnpo, dapo: the sum over every completion token of the batch / their number (in TRL, dapo divides by the tokens
  of the whole generation batch and bnpo by the micro-batch's; a step here is one batch, so they agree);
- dr_grpo: the sum over every completion token / (N * max_completion_length), a constant (Dr. GRPO).

With one optimizer step per batch of completions (num_iterations = 1) log p_old is log p itself, detached: r = 1 in
value, and the gradient is the policy gradient A * grad log p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from gpt2.model import GPT

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none"]
LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none")
STD_EPSILON = 1e-4  # TRL's: advantages / (std + 1e-4), so a group of equal rewards gets advantage 0, not NaN


def nan_std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The standard deviation with Bessel's correction over the values that are not NaN (NaN for fewer than two):
    TRL's `nanstd`, which the advantages are scaled by."""
    if dim is None:
        values, dim = values.reshape(-1), 0
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    count = (~values.isnan()).sum(dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    variance = variance * torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    return variance.sqrt().squeeze(dim)


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: ScaleRewards = "group"
) -> torch.Tensor:
    """rewards (N,) of N = prompts x G rows, each prompt's G completions side by side -> advantages (N,).

    reward - its group's mean, divided by std + 1e-4 (the group's, the batch's, or none). A NaN reward (a
    completion the reward function could not score) counts in no mean and gets advantage 0.

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2).tolist()
    [0.7070..., -0.7070..., 0.0, 0.0]
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale_rewards!r}")
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(f"rewards must be (prompts x {num_generations},), got shape {tuple(rewards.shape)}")
    groups = rewards.view(-1, num_generations)  # (prompts, G)
    mean = torch.nanmean(groups, dim=1).repeat_interleave(num_generations)
    advantages = rewards - mean
    if scale_rewards == "group":
        advantages = advantages / (nan_std(groups, dim=1).repeat_interleave(num_generations) + STD_EPSILON)
    elif scale_rewards == "batch":
        advantages = advantages / (nan_std(rewards) + STD_EPSILON)
    return torch.nan_to_num(advantages, nan=0.0)


def completion_logprobs(
    model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int, temperature: float = 1.0
) -> torch.Tensor:
    """The log-probability of each completion token under `model`, (N, C) float32, where input_ids (N, P + C) is
    each row's left-padded prompt followed by its right-padded completion of C columns, and attention_mask (N, P +
    C) is 1 on real tokens. The logits are divided by `temperature`, the distribution the tokens were sampled from
    (as TRL scores them). Positions count from each row's first real token (padding takes none), as the engine
    that sampled them counts; only the last C + 1 positions go through the LM head."""
    C = completion_length
    hidden = model.hidden_states(input_ids, attention_mask=attention_mask)[:, -C - 1 : -1]  # (N, C, n_embd)
    logits = model.lm_head(hidden).float() / temperature  # (N, C, V)
    targets = input_ids[:, -C:].unsqueeze(-1)  # (N, C, 1)
    return logits.log_softmax(dim=-1).gather(-1, targets).squeeze(-1)


class RolloutBatch(NamedTuple):
    """One batch of completions to train on (a Trainer batch: a tuple of tensors). old_logprobs and ref_logprobs
    are empty tensors where they are not needed (num_iterations = 1; beta = 0)."""

    input_ids: torch.Tensor
    """(N, P + C) each row's left-padded prompt, then its completion right-padded with end-of-text."""
    attention_mask: torch.Tensor
    """(N, P + C) 1 on real tokens."""
    completion_mask: torch.Tensor
    """(N, C) 1 on the completion tokens that count in the loss (through the first end-of-text)."""
    advantages: torch.Tensor
    """(N,) group-relative advantages."""
    old_logprobs: torch.Tensor
    """(N, C) the tokens' log-probabilities under the policy that sampled them, or empty (then: the policy's now)."""
    ref_logprobs: torch.Tensor
    """(N, C) under the frozen reference model (beta > 0), or empty."""


class LossOutput(NamedTuple):
    loss: torch.Tensor
    """The scalar loss to minimise."""
    kl: torch.Tensor
    """The mean k3 KL to the reference over completion tokens (0 when beta is 0: not computed)."""
    clip_low: torch.Tensor
    """The fraction of completion tokens whose ratio was clipped below (r < 1 - epsilon_low with A < 0)."""
    clip_high: torch.Tensor
    """The fraction clipped above (r > 1 + epsilon_high with A > 0)."""

    @property
    def clip_fraction(self) -> torch.Tensor:
        return self.clip_low + self.clip_high  # the two regions are disjoint (A < 0 or A > 0)


@dataclass(frozen=True)
class GRPOLoss:
    """The GRPO objective (module docstring) with TRL's names and defaults: `GRPOLoss(...)(model, batch)`."""

    loss_type: LossType = "dapo"
    beta: float = 0.0
    """Weight of the KL penalty to the reference model (0: none, and no reference model is needed)."""
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    max_completion_length: int = 256
    """dr_grpo's constant denominator: the completion cap the batch was sampled with."""
    temperature: float = 1.0
    """The sampling temperature: log-probabilities are those of the logits divided by it."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term by the ratio r (module docstring)."""

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {self.loss_type!r}")
        if self.beta < 0 or self.epsilon_low < 0 or self.epsilon_high < 0:
            raise ValueError(f"beta, epsilon_low and epsilon_high must be >= 0, got {self.beta}, {self.epsilon_low}, "
                             f"{self.epsilon_high}")  # fmt: skip
        if self.max_completion_length < 1 or not self.temperature > 0:
            raise ValueError(f"max_completion_length must be >= 1 and temperature > 0, got "
                             f"{self.max_completion_length}, {self.temperature}")  # fmt: skip

    def __call__(self, model: GPT, batch: RolloutBatch) -> LossOutput:
        mask = batch.completion_mask.float()  # (N, C)
        logprobs = completion_logprobs(model, batch.input_ids, batch.attention_mask, mask.size(1), self.temperature)
        old = batch.old_logprobs if batch.old_logprobs.numel() else logprobs.detach()
        advantages = batch.advantages.unsqueeze(1).float()  # (N, 1)
        ratio = torch.exp(logprobs - old)  # (N, C)
        clipped = torch.clamp(ratio, 1 - self.epsilon_low, 1 + self.epsilon_high)
        token_loss = -torch.min(ratio * advantages, clipped * advantages)  # (N, C)
        kl = torch.zeros((), device=mask.device)
        if self.beta != 0.0:
            log_ratio_ref = batch.ref_logprobs - logprobs
            token_kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1  # k3: unbiased, always >= 0
            if self.use_bias_correction_kl:
                token_kl = token_kl * ratio
            token_loss = token_loss + self.beta * token_kl
            kl = masked_mean(token_kl.detach(), mask)
        if self.loss_type == "grpo":
            loss = ((token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        elif self.loss_type == "dr_grpo":
            loss = (token_loss * mask).sum() / (token_loss.size(0) * self.max_completion_length)
        else:  # bnpo, dapo: every completion token of the batch weighs the same
            loss = (token_loss * mask).sum() / mask.sum().clamp(min=1.0)
        ratio = ratio.detach()
        clip_low = masked_mean(((ratio < 1 - self.epsilon_low) & (advantages < 0)).float(), mask)
        clip_high = masked_mean(((ratio > 1 + self.epsilon_high) & (advantages > 0)).float(), mask)
        return LossOutput(loss, kl, clip_low, clip_high)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of values (N, C) over the positions where mask (N, C) is 1."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
