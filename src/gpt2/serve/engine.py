"""The engine: one thread owns the model and decodes every running sequence in one batch (continuous batching),
in parts along vLLM v1's lines:

- the scheduler (gpt2.serve.scheduler) turns the queue and the turn's prefill budget into a plan, as plain data:
  admissions, prefill chunks, whether the rows decode and which speculate;
- the runner (gpt2.serve.runner) executes it on the batch: prefills, the decode step or a speculative step, each
  row's own rules, sampling and log-probabilities;
- output assembly (gpt2.serve.output) turns each drawn token into a `SequenceOutput` (text, stops, finish) for
  the sequence's sink;
- `Engine`, here, is the facade: the thread, submission and its checks, cancellation, shutdown, the grammar
  compiler, the timeline of turns.

Each turn: take the admissions (under the lock), feed the part-way prompt's next chunk, prefill the admitted
prompts (those admitted together in one batched prefill) and draw their first tokens, start the next chunked
prompt, end the cancelled, then take the decode step the plan names: one batched step of every row, (B, 1) tokens
-> (B, V) logits, or with a drafter (`drafter=`: a draft model or prompt lookup, gpt2.inference.speculative) the
speculative step of a greedy row decoding alone (scheduler docstring: a row's tokens are the same either way).
`timeline` records each turn's prefilled tokens and decoding rows.

Sequences join and leave only between steps, so a request never waits for another to finish. A sequence's
prompt + completion is capped at the context (block_size tokens): it ends with finish_reason 'length' there.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from gpt2.inference.processors import LogitsProcessor
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.speculative import Drafter, SpeculationStats
from gpt2.inference.structured import GrammarCompiler, structured_processor
from gpt2.model import GPT
from gpt2.serve.output import finish
from gpt2.serve.prefix_cache import PrefixCache
from gpt2.serve.runner import Runner
from gpt2.serve.scheduler import Admissions, Scheduler
from gpt2.serve.sequence import (
    EngineError,
    EngineFailed,
    EngineStopped,
    QueueFull,
    SequenceRequest,
    SequenceState,
    SequenceStatus,
    Sink,
)
from gpt2.tokenizer.protocol import TextTokenizer

logger = logging.getLogger(__name__)

# Prompt tokens prefilled in one turn of the loop at most (the default of `prefill_chunk`). A decoding stream
# waits for one turn's prefill between two tokens, so this bounds that stall; half of GPT-2's context, a
# full-context prompt takes two turns. Prefill matmuls over 512 rows already run near their best speed (they are
# compute-bound from a few hundred rows on), so the chunks cost little throughput; it is also llama.cpp's default
# physical batch (n_ubatch). Smaller chunks stall less and add a turn (a decode step) per chunk.
PREFILL_CHUNK = 512
TIMELINE_TURNS = 1024  # the last turns `Engine.timeline` keeps (three integers each)
SHUTTING_DOWN = "the server is shutting down"


@dataclass(frozen=True)
class TurnRecord:
    """What one turn of the engine's loop did (`Engine.timeline`): the scheduler's work in tokens, never in time."""

    prefilled: int
    """Prompt tokens fed through the model (cached prefixes not counted): at most `prefill_chunk`."""
    running: int
    """Rows decoding when the turn began."""
    stepped: int
    """Rows in the turn's decode step (0: none ran); those decoding before, and those that joined in the turn."""


class Ticket:
    """The sequences of one `Engine.submit` call; `cancel()` ends those not finished (each then gets a final
    output with finish_reason 'cancelled'), at the next step boundary at the latest."""

    def __init__(self, engine: Engine, sequences: list[SequenceState]) -> None:
        self._engine = engine
        self._sequences = sequences

    def cancel(self) -> None:
        self._engine._cancel(self._sequences)


class Engine:
    """Continuous batching over one model (module docstring). Thread-safe: `submit` and `Ticket.cancel` may be
    called from any thread; the model is used by the engine's thread only.

    `prefill_chunk` bounds the prompt tokens a turn prefills (PREFILL_CHUNK): longer prompts are prefilled over
    several turns, each followed by a decode step of the running rows. `drafter`: speculative steps for a greedy
    sequence decoding alone (gpt2.serve.scheduler).

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
        self.max_queue = max_queue
        self.device = model.transformer.wte.weight.device
        self._runner = Runner(
            model,
            max_rows=max_batch,
            vocab_limit=self.vocab_limit,
            eot_token=tokenizer.eot_token,
            prefix_cache=prefix_cache,
            drafter=drafter,
        )
        self._scheduler = Scheduler(max_rows=self._runner.batch.max_rows, prefill_chunk=prefill_chunk)
        self._timeline: collections.deque[TurnRecord] = collections.deque(maxlen=TIMELINE_TURNS)
        self._waiting: collections.deque[SequenceState] = collections.deque()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._grammars: GrammarCompiler | None = None  # structured output's compiler, built on first use
        self._closing = False  # no new work; finish what is there
        self._aborting = False  # end everything now

    @property
    def _drafter(self) -> Drafter | None:
        return self._runner.drafter

    # ------------------------------------------------------------------------------------ public
    @property
    def max_batch(self) -> int:
        return self._runner.batch.max_rows

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The cache of earlier prompts' keys and values the prefills reuse (None: off). Its counters are read by
        other threads (/metrics) while the engine's thread updates them: plain integers, each read whole."""
        return self._runner.batch.prefix_cache

    @property
    def speculation(self) -> SpeculationStats:
        """Drafted and accepted tokens of every speculative step (/metrics reads them: plain integers)."""
        return self._runner.speculation

    @property
    def active(self) -> int:
        """Sequences that hold a row: decoding, or prefilling their prompt in chunks."""
        return self._runner.active

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
                SequenceState(index, request, sink, max_new, self.device, self.tokenizer, self.vocab_size, grammar)
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
                in_hand = [*admissions.whole, *self._runner.in_flight(), *(s for s in [admissions.chunked] if s)]
                self._fail(in_hand, EngineFailed("internal error while generating"))
        self._fail(self._runner.in_flight(), EngineStopped(SHUTTING_DOWN))  # only after an abort: none after a drain
        self._abort_waiting()

    def _take_admissions(self) -> Admissions[SequenceState]:
        """The scheduler's admissions for this turn (called with the lock held)."""
        part_way = self._runner.prefilling
        remaining = part_way.prefill.remaining if part_way is not None and part_way.prefill is not None else None
        admissions = self._scheduler.admit(
            self._waiting, cost=self._runner.prefill_cost, active=self.active, part_way_remaining=remaining
        )
        for sequence in [*admissions.whole, *(s for s in [admissions.chunked] if s is not None)]:
            sequence.status = SequenceStatus.RUNNING
        return admissions

    def _turn(self, admissions: Admissions[SequenceState]) -> None:
        """Execute a turn's plan (module docstring)."""
        runner, cancelled = self._runner, SequenceStatus.CANCELLED
        running, prefilled_before, fed = len(runner.rows), runner.batch.prefilled, 0
        part_way = runner.prefilling
        if part_way is not None:  # its next chunk first
            if part_way.status is cancelled:
                finish(part_way, reason="cancelled")
            else:
                fed += runner.feed(part_way, admissions.part_way_chunk)
        plain = []  # plain prompts (no scoring) admitted together share one batched prefill
        for sequence in admissions.whole:
            if sequence.status is cancelled:
                finish(sequence, reason="cancelled")
            elif not sequence.prefills:
                finish(sequence, reason="length")  # nothing to generate, nothing to score
            elif sequence.request.prompt_logprobs:  # scored chunk by chunk; whole, here, in one chunk
                fed += runner.score_whole(sequence)
            else:
                plain.append(sequence)
        if plain:
            runner.admit(plain)
        chunked = admissions.chunked
        if chunked is not None and chunked.status is cancelled:
            finish(chunked, reason="cancelled")
        elif chunked is not None:
            fed += runner.start_chunked(chunked, admissions.first_chunk)
        for sequence in runner.rows:
            if sequence.status is cancelled:
                finish(sequence, reason="cancelled")
        runner.release()
        fed += runner.batch.prefilled - prefilled_before
        # (a request arriving meanwhile is seen next turn: reading the queue's size needs no lock)
        plan = self._scheduler.decode(
            [sequence.speculative and runner.drafter is not None for sequence in runner.rows],
            running_before=running,
            admitted=bool(admissions.whole) or chunked is not None,
            waiting=len(self._waiting),
            part_way=runner.prefilling is not None,
        )
        stepped = 0
        if plan.step:
            stepped = len(runner.rows)
            runner.step(plan.speculating)
            runner.release()
        with self._lock:
            self._timeline.append(TurnRecord(prefilled=fed, running=running, stepped=stepped))

    # ------------------------------------------------------------------------------------ endings
    def _cancel(self, sequences: list[SequenceState]) -> None:
        """Mark sequences cancelled; the queued ones end here, the running ones at the next step boundary."""
        with self._lock:
            queued = [sequence for sequence in sequences if sequence.status is SequenceStatus.WAITING]
            for sequence in queued:
                self._waiting.remove(sequence)  # the engine never takes it now; `finish` below ends it
                sequence.status = SequenceStatus.CANCELLED
            for sequence in sequences:
                if sequence.status is SequenceStatus.RUNNING:
                    sequence.status = SequenceStatus.CANCELLED
            self._lock.notify()
        for sequence in queued:
            finish(sequence, reason="cancelled")

    def _abort_waiting(self) -> None:
        with self._lock:
            queued = list(self._waiting)
            self._waiting.clear()
            for sequence in queued:
                sequence.status = SequenceStatus.CANCELLED  # out of the queue: a cancel leaves it to `finish`
        for sequence in queued:
            finish(sequence, error=EngineStopped(SHUTTING_DOWN))

    def _fail(self, sequences: list[SequenceState], error: EngineError) -> None:
        """End sequences with an error and empty the batch."""
        failed = list(sequences)
        self._runner.clear()
        for sequence in failed:
            finish(sequence, error=error)
