"""The engine: one thread owns the model and decodes every running sequence in one batch (continuous batching).

Each turn of its loop:

1. prefill at most `prefill_chunk` prompt tokens (chunked prefill, as vLLM's token budget per step and
   llama-server's batch size bound theirs): first the next chunk of the prompt that is part-way prefilled, if
   any; then waiting sequences, while rows are free, whose prompts fit what is left whole (counted at the tokens
   they feed: a prompt's length less the prefix the prefix cache holds of it), each prefilled into
   its row of the shared KV cache (gpt2.serve.batch; several in one batched prefill) to draw its first token from
   the prefill's logits; then, when no prompt is part-way, the next one, with what is left as its first chunk. A
   part-way prompt is prefilled outside the batch, a chunk per turn, and joins when its last chunk is in. So a
   decode step waits for one chunk's prefill at most, however long the prompts that arrive; `timeline` records
   each turn's prefilled tokens and decoding rows. When more arrived meanwhile and rows are free, and no row was
   decoding before this turn, the next turn admits them before any decode step (so a burst of requests gets its
   first tokens without waiting for decode steps in between: the time to the first token is what the burst's
   clients see); a row that was decoding never waits more than one turn's prefill;
2. run one batched decode step for all active sequences, (B, 1) tokens -> (B, V) logits;
3. per row, with that sequence's own settings: log-probabilities when asked (of the model's distribution, before
   any rule and temperature), then the logits processors its SamplingParams asks for (penalties, bias, bans,
   minimum length: gpt2.inference.processors, the same the offline decoder applies) and `sample_next_token`
   with the sequence's own generator (seeded: the tokens a lone `LLM.generate` call with that seed draws);
4. hand each sequence's new text to its consumer (`sink`), and let finished or cancelled sequences leave.

With a drafter (`drafter=`: a draft model or prompt lookup, gpt2.inference.speculative), a sequence decoding alone
(one row, nobody waiting: the one-user case, where a step reads every weight for one token) takes speculative
steps instead of step 2-3: the drafter proposes up to k tokens, one forward of the row verifies them all
(`DecodeBatch.extend`), the rejected ones are rolled back, and the kept ones plus the target's next token go out
together. Greedy gives the tokens plain decoding gives; sampling, the same distribution (the rejection rule), not
the same draws. Sequences with rules (penalties, bans, grammars) or log-probabilities decode as usual, as do
all sequences while several run.

With a prefix cache (gpt2.serve.prefix_cache), a prompt that starts with an earlier prompt's tokens reuses their
keys and values instead of prefilling them (every token they share, a chunked prompt's too; prompts that ask for
their own log-probabilities reuse none, as they need every position's logits). Its counters are
`prefix_cache.queries` / `.hits`. Those scored prompts are prefilled outside the batch
(gpt2.serve.batch.ChunkedPrefill), in chunks when long, each chunk's logits scored as they come: what one prefill
gives, holding one chunk's (T, V) logits at a time.

Sequences join and leave only between steps, so a request never waits for another to finish. A sequence's
prompt + completion is capped at the context (block_size tokens): it ends with finish_reason 'length' there.

Every sequence ends with exactly one final `SequenceOutput` (finish_reason 'stop', 'length' or 'cancelled', or
an error), so a consumer always knows when to stop listening. The sink is called on the engine thread (or on
the canceller's), so it must be quick and thread-safe (the server's puts onto an asyncio queue with
`loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gpt2.inference.processors import LogitsProcessor, apply_processors, build_processors, with_end_of_text
from gpt2.inference.sampling import SamplingParams, sample_next_token
from gpt2.inference.speculative import Drafter, Sampler, verify_drafts
from gpt2.inference.structured import GrammarCompiler, structured_processor
from gpt2.inference.text import TextAssembler
from gpt2.model import GPT
from gpt2.serve.batch import ChunkedPrefill, DecodeBatch, reusable_prefix
from gpt2.serve.prefix_cache import PrefixCache
from gpt2.tokenizer.protocol import TextTokenizer

logger = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's chat limit)
# Prompt tokens prefilled in one turn of the loop at most (the default of `prefill_chunk`). A decoding stream
# waits for one turn's prefill between two tokens, so this bounds that stall; half of GPT-2's context, a
# full-context prompt takes two turns. Prefill matmuls over 512 rows already run near their best speed (they are
# compute-bound from a few hundred rows on), so the chunks cost little throughput; it is also llama.cpp's default
# physical batch (n_ubatch). Smaller chunks stall less and add a turn (a decode step) per chunk.
PREFILL_CHUNK = 512
TIMELINE_TURNS = 1024  # the last turns `Engine.timeline` keeps (three integers each)
SHUTTING_DOWN = "the server is shutting down"


class EngineError(RuntimeError):
    """Why the engine could not take or finish a sequence. Each kind is its own class, so that callers (the
    server's table of HTTP statuses) tell them apart by type, never by message."""


class QueueFull(EngineError):
    """The engine's waiting queue has no room for the sequences submitted: try again shortly."""


class EngineStopped(EngineError):
    """The engine is shutting down (or was stopped) and takes no new work; sequences it had end with it."""


class EngineFailed(EngineError):
    """A step failed inside the engine (a bug of ours): the sequences in it end; the engine serves the others."""


class SequenceStatus(enum.Enum):
    """Where a sequence is, as vLLM keeps it: each moves forward only, WAITING -> RUNNING -> FINISHED, or to
    CANCELLED when asked to stop while running (the engine then finishes it at the next step boundary)."""

    WAITING = "waiting"  # queued for a row
    RUNNING = "running"  # taken for a row: prefilling or decoding
    CANCELLED = "cancelled"  # running, asked to stop
    FINISHED = "finished"  # its final output is out


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

    def __post_init__(self) -> None:
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int) or not 0 <= self.logprobs
        ):
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
    """What one sequence produced since its previous output; the last one has `finish_reason` (or `error`)."""

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
    """Why the sequence ended without finishing (EngineStopped, EngineFailed); its message is for the user."""

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


Sink = Callable[[SequenceOutput], None]


@dataclass(frozen=True)
class TurnRecord:
    """What one turn of the engine's loop did (`Engine.timeline`): the scheduler's work in tokens, never in time."""

    prefilled: int
    """Prompt tokens fed through the model (cached prefixes not counted): at most `prefill_chunk`."""
    running: int
    """Rows decoding when the turn began."""
    stepped: int
    """Rows in the turn's decode step (0: none ran); those decoding before, and those that joined in the turn."""


@dataclass(frozen=True)
class _Admissions:
    """What a turn takes from the queue (module docstring, step 1)."""

    whole: list[_Sequence]  # prompts prefilled whole this turn (or none to prefill: nothing to generate)
    chunked: _Sequence | None = None  # a prompt to prefill in chunks, starting this turn
    first_chunk: int = 0  # its first chunk at most: what is left of the turn's budget


class _Sequence:
    """The engine's state of one sequence."""

    def __init__(
        self,
        index: int,
        request: SequenceRequest,
        sink: Sink,
        max_new: int,
        device: torch.device,
        tokenizer: TextTokenizer,
        vocab_size: int,
        grammar: LogitsProcessor | None = None,
    ) -> None:
        self.index = index
        self.request = request
        self.sink = sink
        self.max_new = max_new  # the completion's cap: max_tokens, or less at the context
        self.status = SequenceStatus.WAITING
        self.row: int | None = None  # its row in the batch while it has one
        self.pending = 0  # the last token drawn: fed to the model at the next step
        self.generated = 0
        self.text: TextAssembler | None = None
        self.prefill: ChunkedPrefill | None = None  # while its prompt is prefilled in chunks
        self.prompt_logprobs: list[TokenLogprob | None] = []  # scored chunk by chunk, when the request asks
        params = with_end_of_text(request.params, tokenizer)  # bad-word texts as ids, end-of-text a stop id
        self.stop_ids = frozenset(params.stop_token_ids)
        # The rules the offline decoder applies too (a ValueError here, e.g. a bias on an id past the vocabulary,
        # refuses the request); `tokens` is what they see: the prompt, then every token drawn.
        self.processors = build_processors(params, prompt_length=len(request.prompt), vocab_size=vocab_size)
        if grammar is not None:  # after the rules, as the offline decoder runs it
            self.processors.append(grammar)
        self.tokens = list(request.prompt)  # what the rules and the drafter see: the prompt, then every token drawn
        # the same as the rules take them, (1, P + max_new) filled as tokens come (a tensor built from the list each
        # step cost ~15 us at 300 tokens, ~40 at 1000)
        self.token_ids: torch.Tensor | None = None
        if self.processors:
            self.token_ids = torch.tensor([self.tokens + [0] * max_new], dtype=torch.long, device=device)
        self.speculable = not self.processors and request.logprobs is None  # speculative steps can serve it
        self.generator = torch.Generator(device=device)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()  # a fresh random seed: unseeded sequences differ


class Ticket:
    """The sequences of one `Engine.submit` call; `cancel()` ends those not finished (each then gets a final
    output with finish_reason 'cancelled'), at the next step boundary at the latest."""

    def __init__(self, engine: Engine, sequences: list[_Sequence]) -> None:
        self._engine = engine
        self._sequences = sequences

    def cancel(self) -> None:
        self._engine._cancel(self._sequences)


class Engine:
    """Continuous batching over one model (module docstring). Thread-safe: `submit` and `Ticket.cancel` may be
    called from any thread; the model is used by the engine's thread only.

    `prefill_chunk` bounds the prompt tokens a turn prefills (PREFILL_CHUNK): longer prompts are prefilled over
    several turns, each followed by a decode step of the running rows. `drafter`: speculative steps for a sequence
    decoding alone (module docstring).

    >>> engine = Engine(model, tokenizer, max_batch=8, prefix_cache=PrefixCache(256 << 20))  # doctest: +SKIP
    >>> engine.start()                                                                       # doctest: +SKIP
    >>> ticket = engine.submit([SequenceRequest([464, 3290], SamplingParams(seed=0))], print)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: GPT,
        tokenizer: TextTokenizer,
        *,
        max_batch: int = 16,
        max_queue: int = 64,
        prefix_cache: PrefixCache | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        drafter: Drafter | None = None,
    ) -> None:
        for name, value in (("max_queue", max_queue), ("prefill_chunk", prefill_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.prefill_chunk = prefill_chunk
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.block_size = model.config.block_size
        self.vocab_size = model.config.vocab_size
        self.vocab_limit = min(len(tokenizer), self.vocab_size)  # never draw an id the tokenizer does not have
        self.eot_token = tokenizer.eot_token
        self.max_queue = max_queue
        self.device = model.transformer.wte.weight.device
        self._batch = DecodeBatch(model, max_batch, prefix_cache=prefix_cache)
        self._rows: list[_Sequence] = []  # the active sequences, by row (engine thread only)
        self._prefilling: _Sequence | None = None  # the one whose prompt is part-way prefilled (engine thread only)
        self._timeline: collections.deque[TurnRecord] = collections.deque(maxlen=TIMELINE_TURNS)
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._grammars: GrammarCompiler | None = None  # structured output's compiler, built on first use
        self._drafter = drafter  # None: no speculative steps
        self._drafting: _Sequence | None = None  # the sequence the drafter's state follows (engine thread only)
        self._closing = False  # no new work; finish what is there
        self._aborting = False  # end everything now

    # ------------------------------------------------------------------------------------ public
    @property
    def max_batch(self) -> int:
        return self._batch.max_rows

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The cache of earlier prompts' keys and values the prefills reuse (None: off). Its counters are read by
        other threads (/metrics) while the engine's thread updates them: plain integers, each read whole."""
        return self._batch.prefix_cache

    @property
    def active(self) -> int:
        """Sequences that hold a row: decoding, or prefilling their prompt in chunks."""
        return len(self._rows) + (self._prefilling is not None)

    @property
    def timeline(self) -> list[TurnRecord]:
        """The last turns of the loop (TIMELINE_TURNS at most), oldest first: what each prefilled and stepped."""
        with self._lock:
            return list(self._timeline)

    @property
    def waiting(self) -> int:
        """Sequences queued for a free row."""
        return len(self._waiting)

    def start(self) -> None:
        """Start the engine's thread (once; later calls do nothing)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="gpt2-serve-engine", daemon=True)
                self._thread.start()

    def submit(self, requests: Sequence[SequenceRequest], sink: Sink) -> Ticket:
        """Queue sequences; `sink` gets every `SequenceOutput` of each (its `index` says which).

        ValueError for a prompt that is empty, holds an id outside the vocabulary, or is longer than the
        context; QueueFull when the queue cannot take them all (nothing is queued then); EngineStopped while
        shutting down.
        """
        if not requests:
            raise ValueError("submit needs at least one sequence")
        if len(requests) > self.max_queue:
            raise ValueError(
                f"{len(requests)} sequences in one request is more than the queue holds ({self.max_queue}); "
                "ask for fewer prompts or a smaller n"
            )
        sequences = []
        for index, request in enumerate(requests):
            self.check_prompt(request.prompt)
            if request.params.num_beams > 1:
                raise ValueError("num_beams > 1 is beam search, which this server does not run; use LLM.generate")
            room = self.block_size - len(request.prompt)  # prompt + completion fit the context
            max_new = min(request.params.max_tokens, room)
            grammar = self._grammar(request.params)
            sequences.append(
                _Sequence(index, request, sink, max_new, self.device, self.tokenizer, self.vocab_size, grammar)
            )
        with self._lock:
            if self._closing:
                raise EngineStopped(SHUTTING_DOWN)
            if len(self._waiting) + len(sequences) > self.max_queue:
                raise QueueFull(f"the queue is full ({len(self._waiting)} of {self.max_queue} waiting)")
            self._waiting.extend(sequences)
            self._lock.notify()
        self.start()
        return Ticket(self, sequences)

    def stop(self, timeout: float | None = 0.0) -> None:
        """Take no new work; let running and queued sequences finish for up to `timeout` seconds (None: as long
        as they need), then cancel the rest and end the thread."""
        with self._lock:
            self._closing = True
            self._lock.notify()
            thread = self._thread
        if thread is None:
            self._abort_waiting()
            return
        thread.join(timeout)
        if thread.is_alive():
            with self._lock:
                self._aborting = True
                self._lock.notify()
            thread.join()

    def _grammar(self, params: SamplingParams) -> LogitsProcessor | None:
        """The grammar mask of a structured request (regex / json_schema), compiled with the engine's one
        compiler (built on first use: it holds the vocabulary's tables and caches compiled grammars)."""
        if params.regex is None and params.json_schema is None:
            return None
        with self._lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size)
            compiler = self._grammars
        return structured_processor(params, self.tokenizer, compiler=compiler)

    # ------------------------------------------------------------------------------------ checks
    def check_prompt(self, prompt: Sequence[int]) -> None:
        """ValueError unless `prompt` is 1 to block_size ids of the tokenizer's vocabulary."""
        if len(prompt) == 0:
            raise ValueError("the prompt has no tokens; send some text, or the end-of-text token to start afresh")
        if len(prompt) > self.block_size:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the model's context is {self.block_size}; shorten it"
            )
        for token in prompt:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.vocab_limit:
                raise ValueError(f"prompt token {token!r} is not a token id in [0, {self.vocab_limit})")

    # ------------------------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self.active and not self._closing:
                    self._lock.wait()
                if self._aborting or (self._closing and not self._waiting and not self.active):
                    break
                admissions = self._take_admissions()
            try:
                self._turn(admissions)
            except Exception:  # a bug of ours: fail the sequences in hand, keep serving the others
                logger.exception("engine step failed; ending the sequences in it")
                in_hand = [*admissions.whole, *self._in_flight(), *(s for s in [admissions.chunked] if s is not None)]
                self._fail(in_hand, EngineFailed("internal error while generating"))
        self._fail(self._in_flight(), EngineStopped(SHUTTING_DOWN))  # only after an abort: a drain leaves none
        self._abort_waiting()

    def _in_flight(self) -> list[_Sequence]:
        """The sequences holding a row: the decoding ones, and the one prefilling in chunks."""
        return [*self._rows, *(s for s in [self._prefilling] if s is not None)]

    def _take_admissions(self) -> _Admissions:
        """Waiting sequences for the free rows, within the turn's prefill budget (module docstring, step 1; called
        with the lock held). A whole prompt is counted at the tokens it feeds (`_prefill_cost`)."""
        budget = self.prefill_chunk
        if self._prefilling is not None:
            assert self._prefilling.prefill is not None
            budget -= min(budget, self._prefilling.prefill.remaining)  # its next chunk goes first
        free = self._batch.max_rows - self.active
        whole: list[_Sequence] = []
        chunked = None
        while self._waiting and len(whole) < free:
            sequence = self._waiting[0]
            cost = self._prefill_cost(sequence)
            if cost <= budget:
                whole.append(sequence)
                budget -= cost
            elif self._prefilling is None and budget > 0:
                chunked = sequence  # the rest of the budget is its first chunk
            else:
                break
            self._waiting.popleft()
            sequence.status = SequenceStatus.RUNNING
            if chunked is not None:
                break
        return _Admissions(whole, chunked, budget if chunked is not None else 0)

    def _prefill_cost(self, sequence: _Sequence) -> int:
        """The prompt tokens a sequence will prefill: none when it goes nowhere, its length less its cached prefix
        (looked up now; a chat's 10th turn feeds ~80 tokens of its ~800, so it is prefilled whole in its row, not in
        chunks outside the batch and copied in). If other prompts evict that prefix before it joins, it feeds more
        that turn, at most its length."""
        if not self._prefills(sequence):
            return 0
        prompt = sequence.request.prompt
        prefix = reusable_prefix(self._batch.prefix_cache, prompt, all_logits=bool(sequence.request.prompt_logprobs))
        return len(prompt) - prefix.length

    @staticmethod
    def _prefills(sequence: _Sequence) -> bool:
        """Whether the sequence's prompt goes through the model: one with nothing to generate only if scored."""
        return sequence.max_new > 0 or sequence.request.prompt_logprobs

    def _turn(self, admissions: _Admissions) -> None:
        cancelled = SequenceStatus.CANCELLED
        running, prefilled_before, fed = len(self._rows), self._batch.prefilled, 0
        part_way = self._prefilling
        if part_way is not None:  # its next chunk first
            assert part_way.prefill is not None
            if part_way.status is cancelled:
                self._finish(part_way, reason="cancelled")
            else:
                fed += self._feed(part_way, min(self.prefill_chunk, part_way.prefill.remaining))
        # plain sequences (no prompt scoring) admitted together share one batched prefill; a lone one joins alone
        plain = []
        for sequence in admissions.whole:
            if sequence.status is cancelled:
                self._finish(sequence, reason="cancelled")
            elif not self._prefills(sequence):
                self._finish(sequence, reason="length")  # nothing to generate, nothing to score
            elif sequence.request.prompt_logprobs:  # scored chunk by chunk; whole, here, in one chunk
                sequence.prefill = self._batch.start_prefill(sequence.request.prompt, all_logits=True)
                fed += self._feed(sequence, sequence.prefill.remaining)
            else:
                plain.append(sequence)
        if len(plain) > 1:
            self._admit_together(plain)
        elif plain:
            self._admit(plain[0])
        if admissions.chunked is not None:
            fed += self._start_chunked(admissions.chunked, admissions.first_chunk)
        for sequence in [s for s in self._rows if s.status is cancelled]:
            self._finish(sequence, reason="cancelled")
        fed += self._batch.prefilled - prefilled_before
        stepped = 0
        admitted = bool(admissions.whole) or admissions.chunked is not None
        # with no row decoding before, more that arrived meanwhile are admitted before decoding (first tokens first)
        hold = running == 0 and admitted and bool(self._waiting) and self.active < self._batch.max_rows
        if self._rows and not hold:
            stepped = len(self._rows)
            # (a request arriving meanwhile is seen next turn: reading the queue's size needs no lock)
            alone = stepped == 1 and not self._waiting and self._prefilling is None
            if alone and self._drafter is not None and self._rows[0].speculable:
                self._speculate(self._rows[0], self._drafter)
            else:
                tokens = torch.tensor([sequence.pending for sequence in self._rows], dtype=torch.long)
                logits = self._batch.step(tokens)  # (B, V)
                self._sample(list(self._rows), logits)
        with self._lock:
            self._timeline.append(TurnRecord(prefilled=fed, running=running, stepped=stepped))

    @torch.no_grad()
    def _speculate(self, sequence: _Sequence, drafter: Drafter) -> None:
        """One speculative step of the lone row: drafts, one verifying forward, then the kept tokens and the
        target's next one, as gpt2.inference.speculative.speculative_stream takes them."""
        if self._drafting is not sequence:  # the drafter's state (a draft model's cache) follows one sequence
            drafter.start(slide_by=None, native=True)
            self._drafting = sequence
        params = sequence.request.params
        sampler = Sampler(params.temperature, params.top_k, params.top_p)
        n = len(sequence.tokens)  # committed tokens; the cache holds all but the last (pending)
        # never draft past the budget (the step's last token is the target's own) or the context
        k = min(drafter.max_draft(), sequence.max_new - sequence.generated - 1, self.block_size - n)
        history = torch.tensor(sequence.tokens + [0] * max(k, 0), dtype=torch.long, device=self.device)
        drafts, q = history[:0], None
        if k > 0:
            drafts, q = drafter.propose(history, n, k, sampler, self.vocab_limit, sequence.generator)
        logits = self._batch.extend(torch.cat([history[n - 1 : n], drafts]))[:, : self.vocab_limit]  # (k' + 1, V)
        accepted, token = verify_drafts(logits.float(), drafts, q, sampler, sequence.generator)
        self._batch.rollback(drafts.numel() - accepted)
        drafter.accept(n + accepted)
        for drawn in [*drafts[:accepted].tolist(), token]:
            self._accept(sequence, drawn, None, None)
            if sequence.status is SequenceStatus.FINISHED:  # a stop token or the length: the rest is dropped
                break

    def _start_chunked(self, sequence: _Sequence, first_chunk: int) -> int:
        """Begin prefilling a prompt in chunks (its cached prefix, if any, is copied in first); returns the tokens
        fed this turn."""
        if sequence.status is SequenceStatus.CANCELLED:
            self._finish(sequence, reason="cancelled")
            return 0
        request = sequence.request
        sequence.prefill = self._batch.start_prefill(request.prompt, all_logits=request.prompt_logprobs)
        self._prefilling = sequence
        return self._feed(sequence, min(first_chunk, sequence.prefill.remaining))

    @torch.no_grad()
    def _feed(self, sequence: _Sequence, tokens: int) -> int:
        """Prefill the next `tokens` of a sequence's prompt outside the batch (scoring them, when asked). After
        the last, the sequence joins the batch and draws its first token, or, with nothing to generate, ends with
        its prompt's scores. Returns `tokens`."""
        prefill, request = sequence.prefill, sequence.request
        assert prefill is not None
        start = prefill.done
        logits = prefill.advance(tokens)  # (tokens, V) when scoring, else (1, V): the last position's
        if request.prompt_logprobs:
            sequence.prompt_logprobs += self._score(request.prompt, logits, start, request.logprobs or 0)
        if prefill.remaining > 0:
            return tokens
        if sequence is self._prefilling:
            self._prefilling = None
        sequence.prefill = None  # its cache goes once the batch holds a copy
        prompt_logprobs = sequence.prompt_logprobs if request.prompt_logprobs else None
        if sequence.max_new == 0:
            self._finish(sequence, reason="length", prompt_logprobs=prompt_logprobs)
            return tokens
        self._batch.join_prefilled(prefill)
        self._seat(sequence)
        self._sample([sequence], logits[-1:], prompt_logprobs=prompt_logprobs)
        return tokens

    @torch.no_grad()
    def _admit(self, sequence: _Sequence) -> None:
        """Prefill a plain prompt into its row, then draw the first token."""
        logits = self._batch.join(sequence.request.prompt)  # (V,)
        self._seat(sequence)
        self._sample([sequence], logits.unsqueeze(0))

    @torch.no_grad()
    def _admit_together(self, sequences: list[_Sequence]) -> None:
        """`_admit` for several plain sequences with one batched prefill (`DecodeBatch.join_many`)."""
        logits = self._batch.join_many([sequence.request.prompt for sequence in sequences])  # (n, V)
        for sequence in sequences:
            self._seat(sequence)
        self._sample(sequences, logits)

    def _seat(self, sequence: _Sequence) -> None:
        """A sequence the batch just joined takes the next row and its text assembler."""
        sequence.text = TextAssembler(self.tokenizer, sequence.request.params.stop)
        sequence.row = len(self._rows)
        self._rows.append(sequence)

    def _score(self, prompt: Sequence[int], logits: torch.Tensor, start: int, top: int) -> list[TokenLogprob | None]:
        """The log-probabilities of the prompt tokens that the logits (T, V) of positions [start, start + T)
        predict, each given the tokens before it: row t scores token start + t + 1 (the first token, which nothing
        predicts, gets None; the last position predicts past the prompt)."""
        logprobs = F.log_softmax(self._limit(logits.float()), dim=-1)  # (T, V)
        scored: list[TokenLogprob | None] = [None] if start == 0 else []
        for row, token in enumerate(prompt[start + 1 : start + 1 + len(logprobs)]):
            scored.append(self._token_logprob(logprobs[row], token, top))
        return scored

    def _limit(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits with the ids the tokenizer lacks (a padded vocabulary) at -inf, in place."""
        if self.vocab_limit < self.vocab_size:
            logits[..., self.vocab_limit :] = float("-inf")
        return logits

    @staticmethod
    def _token_logprob(logprobs: torch.Tensor, token: int, top: int) -> TokenLogprob:
        """logprobs (V,) of one position -> the token's own and the `top` most likely alternatives."""
        alternatives: tuple[tuple[int, float], ...] = ()
        if top:
            values, ids = torch.topk(logprobs, top)
            alternatives = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        return TokenLogprob(token, float(logprobs[token]), alternatives)

    def _sample(
        self,
        sequences: list[_Sequence],
        logits: torch.Tensor,
        *,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
    ) -> None:
        """Draw the next token of each sequence from its row of logits (B, V), hand out the text, and let the
        finished leave. Each row gets its own rules (penalties, bias, bans: gpt2.inference.processors, as the
        offline decoder applies them), then the rows that share the sampler's settings draw together, each with its
        own generator: what each draws alone (`sample_next_token` with a generator per row), in one top-k pass
        instead of one a row (16 int8 rows: 2.9 ms a step, 10% of it, drawing row by row)."""
        logits = self._limit(logits.float())
        ruled = logits  # the rows after their rules; `logits` stays the model's, for log-probabilities
        for row, sequence in enumerate(sequences):
            if sequence.token_ids is not None:  # it has rules
                ruled = logits.clone() if ruled is logits else ruled
                token_ids = sequence.token_ids[:, : len(sequence.tokens)]  # (1, T)
                ruled[row : row + 1] = apply_processors(sequence.processors, token_ids, ruled[row : row + 1])
        groups: dict[tuple[float, int | None, float | None], list[int]] = {}
        for row, sequence in enumerate(sequences):
            params = sequence.request.params
            groups.setdefault((params.temperature, params.top_k, params.top_p), []).append(row)
        tokens = [0] * len(sequences)
        for (temperature, top_k, top_p), rows in groups.items():
            drawn = sample_next_token(
                ruled if len(rows) == len(sequences) else ruled[rows],  # (n, V)
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=[sequences[row].generator for row in rows],
            )
            for row, token in zip(rows, drawn.tolist(), strict=True):
                tokens[row] = token
        for row, sequence in enumerate(sequences):
            logprobs = F.log_softmax(logits[row], dim=-1) if sequence.request.logprobs is not None else None
            self._accept(sequence, tokens[row], logprobs, prompt_logprobs)

    def _accept(
        self,
        sequence: _Sequence,
        token: int,
        logprobs: torch.Tensor | None,
        prompt_logprobs: list[TokenLogprob | None] | None,
    ) -> None:
        """Record a drawn token: its text goes to the sink, and the sequence ends when it should."""
        assert sequence.text is not None
        sequence.generated += 1
        sequence.pending = token
        sequence.tokens.append(token)
        if sequence.token_ids is not None:
            sequence.token_ids[0, len(sequence.tokens) - 1] = token
        output = SequenceOutput(sequence.index, prompt_logprobs=prompt_logprobs, completion_tokens=sequence.generated)
        reason = None
        if token == self.eot_token or token in sequence.stop_ids:
            reason = "stop"
        else:
            output.token_ids.append(token)
            if logprobs is not None:
                output.logprobs.append(self._token_logprob(logprobs, token, sequence.request.logprobs or 0))
            output.text, stopped = sequence.text.push(token)
            if stopped:
                reason = "stop"
        if reason is None and sequence.generated >= sequence.max_new:
            reason = "length"
        if reason is not None:
            output.text += sequence.text.finish()
            self._finish(sequence, reason=reason, output=output)
        else:
            self._emit(sequence, output)

    # ------------------------------------------------------------------------------------ endings
    def _finish(
        self,
        sequence: _Sequence,
        *,
        reason: str | None = None,
        error: EngineError | None = None,
        output: SequenceOutput | None = None,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
    ) -> None:
        """The sequence's final output; it leaves the batch."""
        if sequence.status is SequenceStatus.FINISHED:
            return
        sequence.status = SequenceStatus.FINISHED
        if sequence is self._prefilling:
            self._prefilling = None
        sequence.prefill = None
        if sequence.row is not None and sequence in self._rows:
            moved = self._batch.leave(sequence.row)
            self._rows[sequence.row] = self._rows[-1]
            self._rows.pop()
            if moved is not None:
                self._rows[sequence.row].row = sequence.row
        sequence.row = None
        output = output or SequenceOutput(sequence.index, completion_tokens=sequence.generated)
        output.finish_reason = None if error else reason
        output.error = error
        if prompt_logprobs is not None:
            output.prompt_logprobs = prompt_logprobs
        self._emit(sequence, output)

    @staticmethod
    def _emit(sequence: _Sequence, output: SequenceOutput) -> None:
        try:
            sequence.sink(output)
        except Exception:  # a consumer that went away must not stop the engine
            logger.warning("could not deliver an output of sequence %d", sequence.index, exc_info=True)

    def _cancel(self, sequences: list[_Sequence]) -> None:
        """Mark sequences cancelled; the queued ones end here, the running ones at the next step boundary."""
        with self._lock:
            queued = [sequence for sequence in sequences if sequence.status is SequenceStatus.WAITING]
            for sequence in queued:
                self._waiting.remove(sequence)
                sequence.status = SequenceStatus.FINISHED
            for sequence in sequences:
                if sequence.status is SequenceStatus.RUNNING:
                    sequence.status = SequenceStatus.CANCELLED
            self._lock.notify()
        for sequence in queued:
            self._emit(sequence, SequenceOutput(sequence.index, finish_reason="cancelled"))

    def _abort_waiting(self) -> None:
        with self._lock:
            queued = list(self._waiting)
            self._waiting.clear()
        for sequence in queued:
            if sequence.status is not SequenceStatus.FINISHED:
                sequence.status = SequenceStatus.FINISHED
                self._emit(sequence, SequenceOutput(sequence.index, error=EngineStopped(SHUTTING_DOWN)))

    def _fail(self, sequences: list[_Sequence], error: EngineError) -> None:
        """End sequences with an error and empty the batch."""
        failed = list(sequences)
        self._rows.clear()
        self._batch.clear()
        self._prefilling = None
        for sequence in failed:
            sequence.row = None
            self._finish(sequence, error=error)
