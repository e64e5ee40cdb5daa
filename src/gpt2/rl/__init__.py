"""Reinforcement learning with verifiable rewards: GRPO (`loss`) on completions sampled by the serving engine from
the policy's own weights in the same process (`rollout`), scored by a reward function (`rewards`)."""

from gpt2.rl.config import RLConfig
from gpt2.rl.loss import GRPOLoss, LossOutput, RolloutBatch, completion_logprobs, group_advantages
from gpt2.rl.rewards import BUILTIN_TASKS, addition_prompts, load_reward, read_prompts
from gpt2.rl.rollout import Completion, Rollouts
from gpt2.rl.run import RLResult, rl

__all__ = [
    "BUILTIN_TASKS",
    "Completion",
    "GRPOLoss",
    "LossOutput",
    "RLConfig",
    "RLResult",
    "RolloutBatch",
    "Rollouts",
    "addition_prompts",
    "completion_logprobs",
    "group_advantages",
    "load_reward",
    "read_prompts",
    "rl",
]
