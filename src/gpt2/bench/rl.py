"""Rollout throughput of RL: completions per second drawn for GRPO's groups, ours (`gpt2.rl.Rollouts`: the serving
engine over the policy's own weights, what `gpt2 rl` samples with) against TRL's rollout without vLLM (opt-in:
transformers' `generate` on the same weights, with the GenerationConfig GRPOTrainer builds: do_sample, temperature,
top_p, top_k=0, the pad and end-of-text ids, no compilation), on the same prompts, each repeated G times.

Random prompts of a random model rarely end early, so both sides generate about max_tokens tokens per completion;
the record keeps the tokens each side generated per completion, so a difference in work shows.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpt2.bench.record import Recorder
from gpt2.bench.setup import SEED, BenchSettings, bench_model, bench_tokenizer, prompt_ids
from gpt2.bench.timing import interleaved, timed
from gpt2.inference.sampling import SamplingParams
from gpt2.rl.rollout import Rollouts

OURS, TRL = "ours", "trl"  # the engines' names; the peer's is its records' peer


@dataclass(frozen=True)
class RolloutWork:
    prompts: int = 8
    generations: int = 8
    """G: completions per prompt."""
    prompt_tokens: int = 32
    max_tokens: int = 64
    max_batch: int | None = None
    """Sequences our engine decodes at once (default: all of them, as generate's one batch)."""
    peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if any(peer != TRL for peer in self.peers):
            raise ValueError(f"rl peers: trl only, got {', '.join(self.peers)}")
        if min(self.prompts, self.generations, self.prompt_tokens, self.max_tokens) < 1:
            raise ValueError("--prompts, --generations, --prompt-tokens and --max-tokens must be at least 1")

    @property
    def completions(self) -> int:
        return self.prompts * self.generations


def trl_generate(theirs: Any, prompts: torch.Tensor, work: RolloutWork, eot: int) -> Callable[[], torch.Tensor]:
    """GRPOTrainer's rollout without vLLM: one `generate` over the (prompts x G) rows with its GenerationConfig."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=work.max_tokens, do_sample=True, pad_token_id=eot, eos_token_id=[eot],
                              temperature=1.0, top_p=1.0, top_k=0, disable_compile=True)  # fmt: skip
    rows = prompts.repeat_interleave(work.generations, dim=0)  # (N, P): each prompt's G rows side by side

    @torch.no_grad()
    def run() -> torch.Tensor:
        mask = torch.ones_like(rows)
        return theirs.generate(input_ids=rows, attention_mask=mask, generation_config=config)[:, rows.size(1) :]

    return run


def run_rl(settings: BenchSettings, work: RolloutWork, recorder: Recorder) -> None:
    """`gpt2 bench rl`: completions/s of a batch of GRPO groups, ours and TRL's alternating."""
    device = settings.torch_device
    ours = bench_model(settings).to(device)
    tokenizer = bench_tokenizer(settings)
    # (prompts, P) ids of ordinary tokens: below end-of-text, which also bounds a byte tokenizer's ids
    prompts = prompt_ids(work.prompts, work.prompt_tokens, min(ours.config.vocab_size, tokenizer.eot_token))
    rows = [row for row in prompts.tolist() for _ in range(work.generations)]
    tokens: dict[str, list[float]] = {OURS: [], TRL: []}
    rollouts = Rollouts(ours, tokenizer, max_batch=work.max_batch or work.completions, max_queue=work.completions)
    draws = [0]

    def run_ours() -> None:
        draws[0] += 1  # fresh seeds each call, as each RL step draws
        params = [SamplingParams(max_tokens=work.max_tokens, seed=SEED + draws[0] * len(rows) + i)
                  for i in range(len(rows))]  # fmt: skip
        completions = rollouts.sample(rows, params)
        tokens[OURS].append(sum(len(c.token_ids) for c in completions) / len(completions))

    engines: dict[str, Callable[[], float]] = {OURS: lambda: work.completions / timed(run_ours, device)}
    if TRL in work.peers:
        from transformers import GPT2LMHeadModel

        from gpt2.weights import save_pretrained

        with tempfile.TemporaryDirectory() as folder:
            save_pretrained(ours, folder)
            theirs = GPT2LMHeadModel.from_pretrained(folder).eval().to(device)
        generate = trl_generate(theirs, prompts.to(device), work, tokenizer.eot_token)

        def run_theirs() -> None:
            completions = generate()
            ended = (completions == tokenizer.eot_token).int()
            lengths = torch.where(ended.any(1), ended.argmax(1) + 1, completions.size(1))  # through the first end
            tokens[TRL].append(float(lengths.float().mean()))

        engines[TRL] = lambda: work.completions / timed(run_theirs, device)
    try:
        rates = interleaved(engines, warmup=settings.warmup, repetitions=settings.repetitions)
    finally:
        rollouts.close()
    params = {"prompts": work.prompts, "generations": work.generations, "prompt_tokens": work.prompt_tokens,
              "max_tokens": work.max_tokens, "max_batch": work.max_batch or work.completions,
              "tokens_per_completion": round(sum(tokens[OURS]) / len(tokens[OURS]), 1), "device": device.type,
              **settings.model_params()}  # fmt: skip
    if tokens[TRL]:
        params["peer_tokens_per_completion"] = round(sum(tokens[TRL]) / len(tokens[TRL]), 1)
    peer = (TRL, rates[TRL]) if TRL in rates else None
    recorder.add("rl", "rollout completions/s", params, rates[OURS], "completions/s", peer)
