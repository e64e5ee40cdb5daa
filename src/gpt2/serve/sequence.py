"""The records the engine's parts share: a request (`SequenceRequest`), its state while the engine holds it
(`SequenceState`: the one per-row record the scheduler, the runner and the output assembly read and write), its
status, the output handed to the HTTP layer (`SequenceOutput`), and the engine's errors.

A per-row property (sampling settings, a drafter's eligibility, log-probabilities, rules, and whatever a row
needs later) lives on the request and its state, so it travels from `Engine.submit` through the scheduler's plan to
the runner's forward without a parameter added anywhere in between.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpt2.config import is_integer
from gpt2.inference.processors import LogitsProcessor, build_processors, with_end_of_text
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.speculative import speculates
from gpt2.inference.steering import Intervention
from gpt2.inference.text import TextAssembler
from gpt2.serve.batch import ChunkedPrefill
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights.adapters import LoRAAdapter

MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's chat limit)


class EngineError(RuntimeError):
    """Why the engine could not take or finish a sequence. Each kind is its own class, so that callers (the
    server's table of HTTP statuses) tell them apart by type, never by message."""


class QueueFull(EngineError):
    """The engine's waiting queue has no room for the sequences submitted: try again shortly."""


class EngineStopped(EngineError):
    """The engine is shutting down (or was stopped) and takes no new work; sequences it had end with it."""


class EngineFailed(EngineError):
    """A step failed inside the engine (a bug of ours): the sequences in it end; the engine serves the others."""


class SequenceFailed(EngineError):
    """One sequence's own computation failed (gpt2.serve.runner): its logits were not finite (an overflowing
    steering or adapter), or its steering, adapter or rules raised. It alone ends; the rows beside it go on."""


class SequenceStatus(enum.Enum):
    """Where a sequence is, as vLLM keeps it: each moves forward only, WAITING -> RUNNING -> FINISHED (or FAILED),
    through CANCELLED when asked to stop (a queued one leaves the queue at once; a running one the engine finishes
    at the next step boundary)."""

    WAITING = "waiting"  # queued for a row
    RUNNING = "running"  # taken for a row: prefilling or decoding
    CANCELLED = "cancelled"  # asked to stop, its final output not yet out
    FINISHED = "finished"  # its final output is out, with a finish reason
    FAILED = "failed"  # its final output is out, an error: its row's keys and values are not to be trusted


@dataclass(frozen=True)
class SequenceRequest:
    """One sequence to generate: a prompt (token ids) and how to continue it. `params.n` is ignored: a request
    for n continuations submits n of these (each with `params.for_sample(i)`)."""

    prompt: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    logprobs: int | None = None
    """Log-probabilities of the generated tokens with this many top alternatives each (0: the token's own
    only); None: none."""
    prompt_logprobs: bool = False
    """Also the log-probability of every prompt token given the ones before it (the first has none)."""
    grammar: Any = None
    """params' regex / json_schema compiled (`GrammarCompiler.compile`) by a caller that compiles off the engine's
    path (the server, within its time limit: gpt2.serve.grammar); None: `Engine.submit` compiles it."""
    steering: tuple[Intervention, ...] = ()
    """Interventions applied to this row's forwards (gpt2.inference.steering); its prompt bypasses the prefix
    cache and it never speculates."""
    adapter: LoRAAdapter | None = None
    """The LoRA adapter this row decodes with (gpt2.inference.lora_batch; None: the base model). The request holds
    it, so a sequence keeps its adapter to the end even when the server unloads it meanwhile; its prompt's blocks
    go in the prefix cache under the adapter's key, and it never speculates."""

    def __post_init__(self) -> None:
        if self.logprobs is not None and (not is_integer(self.logprobs) or not 0 <= self.logprobs):
            raise ValueError(f"logprobs must be an integer >= 0 or None, got {self.logprobs!r}")
        if self.logprobs is not None and self.logprobs > MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs may ask for at most {MAX_TOP_LOGPROBS} alternatives, got {self.logprobs}")


@dataclass(frozen=True)
class TokenLogprob:
    """A token, its log-probability under the model, and the most likely alternatives at its position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class SequenceOutput:
    """What one sequence produced since its previous output; the last one has `finish_reason` (or `error`). The
    one record from the engine to the HTTP layer, which renders it as a completion or chat choice."""

    index: int
    """The sequence's position in the list given to `Engine.submit`."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    """Generated tokens of this output (a stop token id is not among them)."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per token in token_ids, when the request asked for logprobs."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """In the first output of a sequence that asked for them: one per prompt token, None for the first."""
    finish_reason: str | None = None
    """'stop' (end-of-text, a stop token or a stop text), 'length' (max_tokens or the context), 'cancelled'."""
    completion_tokens: int = 0
    """Tokens generated so far, a stop token included."""
    error: EngineError | None = None
    """Why the sequence ended without finishing (EngineStopped, EngineFailed, SequenceFailed); its message is for
    the user."""

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def add(self, output: SequenceOutput) -> None:
        """Gather a later output of the same sequence into this one (a whole choice from its outputs)."""
        self.text += output.text
        self.token_ids += output.token_ids
        self.logprobs += output.logprobs
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        self.finish_reason = output.finish_reason or self.finish_reason
        self.completion_tokens = max(self.completion_tokens, output.completion_tokens)
        self.error = output.error or self.error


Sink = Callable[[SequenceOutput], None]


@dataclass(frozen=True)
class SequenceSetup:
    """What every sequence of an engine is built with: its tokenizer, its model's vocabulary size (the logits'
    width) and device."""

    tokenizer: TextTokenizer
    vocab_size: int
    device: torch.device


class SequenceState:
    """The engine's state of one sequence, from submission to its final output."""

    def __init__(
        self,
        index: int,
        request: SequenceRequest,
        sink: Sink,
        max_new: int,
        setup: SequenceSetup,
        grammar: LogitsProcessor | None = None,
    ) -> None:
        tokenizer, device = setup.tokenizer, setup.device
        self.index = index
        self.request = request
        self.sink = sink
        self.max_new = max_new  # the completion's cap: max_tokens, or less at the context
        self.status = SequenceStatus.WAITING
        self.row: int | None = None  # its row in the batch while it has one
        self.pending = 0  # the last token drawn: fed to the model at the next step
        self.generated = 0
        self.text = TextAssembler(tokenizer, request.params.stop)
        self.prefill: ChunkedPrefill | None = None  # while its prompt is prefilled in chunks
        self.prompt_logprobs: list[TokenLogprob | None] = []  # scored chunk by chunk, when the request asks
        params = with_end_of_text(request.params, tokenizer)  # bad-word texts as ids, end-of-text a stop id
        self.stop_ids = frozenset(params.stop_token_ids)
        # The rules the offline decoder applies too (a ValueError here, e.g. a bias on an id past the vocabulary,
        # refuses the request); `tokens` is what they see: the prompt, then every token drawn.
        self.processors = build_processors(params, prompt_length=len(request.prompt), vocab_size=setup.vocab_size)
        if grammar is not None:  # after the rules, as the offline decoder runs it
            self.processors.append(grammar)
        self.tokens = list(request.prompt)  # what the rules and the drafter see: the prompt, then every token drawn
        # the same as the rules take them, (1, P + max_new) filled as tokens come (a tensor built from the list each
        # step costs more, the longer the sequence)
        self.token_ids: torch.Tensor | None = None
        if self.processors:
            self.token_ids = torch.tensor([self.tokens + [0] * max_new], dtype=torch.long, device=device)
        # speculative steps may serve it (the one rule of gpt2.inference.speculative.speculates)
        self.speculative = (
            not request.steering
            and request.adapter is None
            and speculates(request.params, rules=bool(self.processors), logprobs=request.logprobs is not None)
        )
        self.generator = torch.Generator(device=device)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()  # a fresh random seed: unseeded sequences differ

    @property
    def prefills(self) -> bool:
        """Whether its prompt goes through the model: one with nothing to generate only if scored."""
        return self.max_new > 0 or self.request.prompt_logprobs

    @property
    def namespace(self) -> bytes:
        """Its prompt's namespace in the prefix cache: its adapter's key (b"": the base model's)."""
        return b"" if self.request.adapter is None else self.request.adapter.key

    @property
    def done(self) -> bool:
        """Whether its final output is out (finished or failed)."""
        return self.status is SequenceStatus.FINISHED or self.status is SequenceStatus.FAILED
