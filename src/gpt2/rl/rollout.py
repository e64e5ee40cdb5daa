"""Rollouts: completions drawn by the server's continuous-batching engine (`gpt2.serve.engine.Engine`) from the
policy itself, in the same process.

The engine decodes the policy module it is given, not a copy: its PyTorch forwards run the module, and its native
decode step (gpt2.cpu.decoder) holds references to the same parameter tensors, which the optimizer updates in
place. So the completions of a step are always drawn from the weights of that step, with no second server and no
weight transfer (TRL needs vLLM beside the trainer and copies the weights to it after each step). Its prefix cache
stays off: keys and values cached under earlier weights would be stale after a step.

A group's G completions are G sequences of the same prompt, each with its own seed; the engine decodes all of a
batch's sequences together, up to `max_batch` rows at a time, and a row that ends frees its place for the next.
The policy must stay in eval mode (dropout off): the engine's native step, and the log-probabilities the loss
compares, are those of the model without dropout.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from gpt2.inference.sampling import SamplingParams
from gpt2.model import GPT
from gpt2.serve.engine import Engine
from gpt2.serve.sequence import SequenceOutput, SequenceRequest
from gpt2.tokenizer.protocol import TextTokenizer


@dataclass(frozen=True)
class Completion:
    """One sampled continuation of a prompt."""

    token_ids: list[int]
    """The generated tokens, the closing end-of-text included when it ended there (the policy learns to stop)."""
    text: str
    """Its text, without the end-of-text and without a stop text that ended it (what the reward sees)."""
    finish_reason: str
    """'stop' (end-of-text or a stop text) or 'length' (max_tokens or the context: truncated)."""


class Rollouts:
    """Draws completions from `model` with the serving engine (module docstring); `close` ends its thread.

    >>> rollouts = Rollouts(model, tokenizer, max_batch=32)                             # doctest: +SKIP
    >>> rollouts.sample([[464, 3290]] * 2, [SamplingParams(seed=0), SamplingParams(seed=1)])  # doctest: +SKIP
    """

    def __init__(self, model: GPT, tokenizer: TextTokenizer, *, max_batch: int = 64, max_queue: int = 1024) -> None:
        if model.training:
            raise ValueError("rollouts need the policy in eval mode (dropout off): call model.eval() first")
        self.model = model
        self.eot_token = tokenizer.eot_token
        self.engine = Engine(model, tokenizer, max_batch=max_batch, max_queue=max_queue, prefix_cache=None)

    def sample(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list[Completion]:
        """One completion of each prompt (token ids) with its own SamplingParams (seed, temperature, top_p, top_k,
        max_tokens, stop, ...: the server's controls), all decoded together; in the prompts' order."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling parameters; pass one per prompt")
        for p in params:
            if p.stop_token_ids:  # a completion's closing stop id is restored from end-of-text alone (see _completion)
                raise ValueError("rollouts stop at end-of-text and at stop texts; stop_token_ids are not supported")
        outputs = [SequenceOutput(index) for index in range(len(prompts))]
        pending = [len(prompts)]
        done = threading.Event()
        lock = threading.Lock()

        def sink(output: SequenceOutput) -> None:  # on the engine's thread
            with lock:
                outputs[output.index].add(output)
                if output.final:
                    pending[0] -= 1
                    if pending[0] == 0:
                        done.set()

        requests = [SequenceRequest(list(prompt), p) for prompt, p in zip(prompts, params, strict=True)]
        ticket = self.engine.submit(requests, sink)
        try:
            done.wait()
        except BaseException:
            ticket.cancel()
            raise
        for output in outputs:
            if output.error is not None:
                raise RuntimeError(f"the engine could not finish a rollout: {output.error}")
        return [self._completion(output) for output in outputs]

    def _completion(self, output: SequenceOutput) -> Completion:
        ids = list(output.token_ids)
        reason = output.finish_reason or "length"
        if output.completion_tokens > len(ids):  # it ended on end-of-text, which the engine does not list
            ids.append(self.eot_token)
        return Completion(ids, output.text, reason)

    def close(self) -> None:
        self.engine.stop()

    def __enter__(self) -> Rollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
