"""The runner: executes the scheduler's plan on the batch (vLLM v1's model runner). It owns the model's batch of
KV-cache rows (gpt2.serve.batch) and the sequences holding them, prefills (whole prompts in one batched prefill,
long or scored ones in chunks outside the batch), runs the decode step and the speculative step, and draws each
row's token: log-probabilities when asked (of the model's distribution, before any rule and temperature), then
the logits processors its SamplingParams asks for (penalties, bias, bans, minimum length, a grammar:
gpt2.inference.processors, the same the offline decoder applies) and `sample_next_token` with the row's own
generator (seeded: the tokens a lone `LLM.generate` call with that seed draws).

A row's LoRA adapter (`SequenceRequest.adapter`) and steering are properties of the row: a forward over rows with
any of them runs the model's layers with each row's own low-rank update added (one batch, gpt2.inference.lora_batch)
and each row's interventions hooked; a forward over plain rows keeps the native decoder.

Each drawn token goes to `commit` (gpt2.serve.output) at once, so a first token leaves before the turn's decode
step; finished sequences leave the batch at `release`.

Failure is a property of a row, as in vLLM's model runner: every product, norm and attention of a batched forward
is row by row, so one row's failure never touches the others, and it ends that row alone (SequenceFailed: the
server answers 400, or an error chunk once it streams), while the rows beside it draw exactly what they draw
alone. A row fails when its logits after a forward are not all finite (an overflowing steering vector or scale,
an adapter's huge weights: `torch.isfinite` per row), when its own steering or adapter raises inside the forward
(recorded against it, gpt2.inference.faults), when its rules (penalties, bans, a grammar) raise, or when they leave
no token to draw. Its row's keys and values are zeroed as it leaves. An exception no row owns (a bug of ours) still
fails the whole step (gpt2.serve.engine).

With a prefix cache (gpt2.serve.prefix_cache), a prompt that starts with an earlier prompt's tokens reuses their
keys and values instead of prefilling them (every token they share, a chunked prompt's too; prompts that ask for
their own log-probabilities reuse none, as they need every position's logits). Scored prompts are prefilled
outside the batch (gpt2.serve.batch.ChunkedPrefill), in chunks when long, each chunk's logits scored as they come.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from gpt2.inference.faults import RowFaults, fault_reason
from gpt2.inference.lora_batch import RoutedView
from gpt2.inference.processors import apply_processors
from gpt2.inference.sampling import sample_next_token
from gpt2.inference.speculative import Drafter, Sampler, SpeculationStats, Speculator, draft_length
from gpt2.inference.steering import steer
from gpt2.model import GPT
from gpt2.serve.batch import DecodeBatch, reusable_prefix
from gpt2.serve.output import commit, finish, token_logprob
from gpt2.serve.prefix_cache import PrefixCache
from gpt2.serve.sequence import SequenceFailed, SequenceState, SequenceStatus, TokenLogprob

logger = logging.getLogger(__name__)


class _LoneRow:
    """The batch's lone row as the target of a speculative step (gpt2.inference.speculative.Target)."""

    def __init__(self, batch: DecodeBatch) -> None:
        self.batch = batch

    def verify(self, tokens: torch.Tensor, n: int, k: int) -> torch.Tensor:
        return self.batch.extend(tokens[n - 1 : n + k])  # (k + 1, V): the last committed token, then the drafts

    def reject(self, count: int) -> None:
        self.batch.rollback(count)


class Runner:
    """The batch and the sequences in it; engine thread only (the counters are read by other threads, plain
    integers each read whole)."""

    def __init__(
        self,
        model: GPT,
        *,
        max_rows: int,
        vocab_limit: int,
        eot_token: int,
        prefix_cache: PrefixCache | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        self.model = model
        self.batch = DecodeBatch(model, max_rows, prefix_cache=prefix_cache)
        self.block_size = model.config.block_size
        self.vocab_size = model.config.vocab_size
        self.vocab_limit = vocab_limit  # never draw an id the tokenizer does not have
        self.eot_token = eot_token
        self.device = model.transformer.wte.weight.device
        self.rows: list[SequenceState] = []  # the decoding sequences, by row
        self.prefilling: SequenceState | None = None  # the one whose prompt is part-way prefilled
        self.drafter = drafter  # None: no speculative steps
        self.speculation = SpeculationStats()  # drafted and accepted tokens of every speculative step
        self._speculator = None if drafter is None else Speculator(_LoneRow(self.batch), drafter, self.speculation)
        self._adapted = RoutedView(model)  # the rows' LoRA adapters on the model's weights
        self._drafting: SequenceState | None = None  # the sequence the drafter's state follows

    @property
    def active(self) -> int:
        """Sequences that hold a row: decoding, or prefilling their prompt in chunks."""
        return len(self.rows) + (self.prefilling is not None)

    def in_flight(self) -> list[SequenceState]:
        """The sequences holding a row: the decoding ones, and the one prefilling in chunks."""
        return [*self.rows, *(s for s in [self.prefilling] if s is not None)]

    def prefill_cost(self, sequence: SequenceState) -> int:
        """The prompt tokens a sequence will prefill: none when it goes nowhere, its length less its cached prefix
        (looked up now; a chat's 10th turn feeds ~80 tokens of its ~800, so it is prefilled whole in its row, not in
        chunks outside the batch and copied in). If other prompts evict that prefix before it joins, it feeds more
        that turn, at most its length."""
        if not sequence.prefills:
            return 0
        prompt = sequence.request.prompt
        if sequence.request.steering:  # a steered prompt reuses no cached prefix
            return len(prompt)
        all_logits = bool(sequence.request.prompt_logprobs)
        prefix = reusable_prefix(self.batch.prefix_cache, prompt, all_logits=all_logits, namespace=sequence.namespace)
        return len(prompt) - prefix.length

    # ------------------------------------------------------------------------------------ prefill
    @contextmanager
    def _forward(self, sequences: Sequence[SequenceState]) -> Iterator[GPT | None]:
        """The forward that runs these rows, until the block ends: None (the batch's model, through the native
        decoder where it can) unless a row has an adapter (the adapted view, each row's update added) or steering
        (the model's forward under the rows' hooks, which the view's layers, the model's own, run as well). A row
        whose steering or adapter raised in it has failed when the block ends (module docstring)."""
        steering = [sequence.request.steering for sequence in sequences]
        faults = RowFaults()
        adapters = [sequence.request.adapter for sequence in sequences]
        with steer(self.model, steering, faults), self._adapted.rows(adapters, faults) as model:
            yield None if model is self.model and not any(steering) else model
        for row, reason in faults.reasons.items():
            self._fail(sequences[row], reason)

    @torch.no_grad()
    def admit(self, sequences: Sequence[SequenceState]) -> None:
        """Prefill plain prompts into their rows (several in one batched prefill, each with its adapter; a steered
        one alone, under its interventions and past the prefix cache), then draw their first tokens."""
        plain = [sequence for sequence in sequences if not sequence.request.steering]
        steered = [sequence for sequence in sequences if sequence.request.steering]
        parts = []
        with self._forward(plain) as model:
            namespaces = [sequence.namespace for sequence in plain]
            if len(plain) == 1:
                joined = self.batch.join(plain[0].request.prompt, namespace=namespaces[0], model=model)
                parts.append(joined.unsqueeze(0))  # (1, V)
            elif plain:
                prompts = [sequence.request.prompt for sequence in plain]
                parts.append(self.batch.join_many(prompts, namespaces=namespaces, model=model))  # (n, V)
        for sequence in plain:
            self._seat(sequence)
        for sequence in steered:
            with self._forward([sequence]) as model:
                parts.append(self.batch.join(sequence.request.prompt, cached=False, model=model).unsqueeze(0))
            self._seat(sequence)
        self.sample([*plain, *steered], torch.cat(parts))

    def start_chunked(self, sequence: SequenceState, first_chunk: int) -> int:
        """Begin prefilling a prompt in chunks (its cached prefix, if any, is copied in first); returns the tokens
        fed this turn."""
        request = sequence.request
        sequence.prefill = self.batch.start_prefill(
            request.prompt,
            all_logits=request.prompt_logprobs,
            cached=not request.steering,
            namespace=sequence.namespace,
        )
        self.prefilling = sequence
        return self.feed(sequence, min(first_chunk, sequence.prefill.remaining))

    def score_whole(self, sequence: SequenceState) -> int:
        """Prefill a scored prompt in one chunk (outside the batch); returns the tokens fed."""
        request = sequence.request
        sequence.prefill = self.batch.start_prefill(request.prompt, all_logits=True, cached=not request.steering,
                                                    namespace=sequence.namespace)  # fmt: skip
        return self.feed(sequence, sequence.prefill.remaining)

    @torch.no_grad()
    def feed(self, sequence: SequenceState, tokens: int) -> int:
        """Prefill the next `tokens` of a sequence's prompt outside the batch (scoring them, when asked). After
        the last, the sequence joins the batch and draws its first token, or, with nothing to generate, ends with
        its prompt's scores. Returns `tokens`."""
        prefill, request = sequence.prefill, sequence.request
        assert prefill is not None
        start = prefill.done
        with self._forward([sequence]) as model:
            logits = prefill.advance(tokens, model)  # (tokens, V) when scoring, else (1, V): the last position's
        if not sequence.done and not bool(torch.isfinite(logits).all()):
            self._fail(sequence, self._not_finite(sequence))
        if sequence.done:  # it failed: its prefill goes (`release` frees it when it is the part-way one)
            sequence.prefill = None
            return tokens
        if request.prompt_logprobs:
            sequence.prompt_logprobs += self._score(request.prompt, logits, start, request.logprobs or 0)
        if prefill.remaining > 0:
            return tokens
        if sequence is self.prefilling:
            self.prefilling = None
        sequence.prefill = None  # its cache goes once the batch holds a copy
        if sequence.max_new == 0:
            finish(sequence, reason="length")
            return tokens
        self.batch.join_prefilled(prefill)
        self._seat(sequence)
        self.sample([sequence], logits[-1:])
        return tokens

    def _seat(self, sequence: SequenceState) -> None:
        """A sequence the batch just joined takes the next row."""
        sequence.row = len(self.rows)
        self.rows.append(sequence)

    # ------------------------------------------------------------------------------------ decode
    @torch.no_grad()
    def step(self, speculating: tuple[int, ...]) -> None:
        """One decode step of every row, (B, 1) tokens -> (B, V) logits, or the speculative step of the lone row
        named in `speculating` (gpt2.serve.scheduler.DecodePlan)."""
        if speculating:
            assert self._speculator is not None and speculating == (0,) and len(self.rows) == 1, "a lone row verifies"
            self._speculate(self.rows[0], self._speculator)
            return
        tokens = torch.tensor([sequence.pending for sequence in self.rows], dtype=torch.long)
        with self._forward(self.rows) as model:  # a row without steering or an adapter is left as it is
            logits = self.batch.step(tokens, model=model)
        self.sample(list(self.rows), logits)

    def _speculate(self, sequence: SequenceState, speculator: Speculator) -> None:
        """One speculative step of the lone row (`Speculator.step`, the offline stream's step): drafts, one
        verifying forward, the rejected drafts rolled back, the kept ones and the target's next token committed."""
        drafter = speculator.drafter
        if self._drafting is not sequence:  # the drafter's state (a draft model's cache) follows one sequence
            drafter.start(slide_by=None, native=True)
            self._drafting = sequence
        params = sequence.request.params
        n = len(sequence.tokens)  # committed tokens; the cache holds all but the last (pending)
        # the verification feeds k + 1 tokens after the n - 1 the cache holds: k <= block_size - n
        k = draft_length(min(drafter.max_draft(), self.block_size - n), sequence.max_new - sequence.generated)
        history = torch.tensor(sequence.tokens + [0] * k, dtype=torch.long, device=self.device)
        sampler = Sampler(params.temperature, params.top_k, params.top_p)
        for token in speculator.step(history, n, k, sampler, self.vocab_limit, sequence.generator):
            commit(sequence, token, None, self.eot_token)  # after a stop or the length, the rest is dropped

    def sample(self, sequences: list[SequenceState], logits: torch.Tensor) -> None:
        """Draw the next token of each sequence from its row of logits (B, V) and commit it. Each row gets its own
        rules, then the rows that share the sampler's settings draw together, each with its own generator: what
        each draws alone (`sample_next_token` with a generator per row), in one top-k pass instead of one a row.
        A row that failed (module docstring) draws nothing; the others draw as they would without it."""
        rows = self._healthy(sequences, logits)
        logits = self._limit(logits.float())
        ruled = logits  # the rows after their rules; `logits` stays the model's, for log-probabilities
        for row in [row for row in rows if sequences[row].token_ids is not None]:  # those with rules
            sequence = sequences[row]
            assert sequence.token_ids is not None
            ruled = logits.clone() if ruled is logits else ruled
            token_ids = sequence.token_ids[:, : len(sequence.tokens)]  # (1, T)
            try:
                ruled[row : row + 1] = apply_processors(sequence.processors, token_ids, ruled[row : row + 1])
            except Exception as error:
                self._fail(sequence, fault_reason("its rules (penalties, bans, bias, grammar)", error))
                rows.remove(row)
        if ruled is not logits:
            excluded = torch.isneginf(ruled.amax(dim=-1)).tolist()  # (B,) rows whose rules leave no token
            for row in [row for row in rows if excluded[row]]:
                self._fail(sequences[row], "every token has logit -inf, nothing is left to draw; the bans, biases or "
                                           "limits exclude the whole vocabulary")  # fmt: skip
                rows.remove(row)
        groups: dict[tuple[float, int | None, float | None], list[int]] = {}
        for row in rows:
            params = sequences[row].request.params
            groups.setdefault((params.temperature, params.top_k, params.top_p), []).append(row)
        tokens = [0] * len(sequences)
        for (temperature, top_k, top_p), members in groups.items():
            drawn = sample_next_token(
                ruled if len(members) == len(sequences) else ruled[members],  # (n, V)
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=[sequences[row].generator for row in members],
            )
            for row, token in zip(members, drawn.tolist(), strict=True):
                tokens[row] = token
        for row in rows:
            sequence = sequences[row]
            logprobs = F.log_softmax(logits[row], dim=-1) if sequence.request.logprobs is not None else None
            commit(sequence, tokens[row], logprobs, self.eot_token)

    def _healthy(self, sequences: list[SequenceState], logits: torch.Tensor) -> list[int]:
        """The rows of logits (B, V) that draw: not those failed in the forward, nor those whose logits are not
        all finite (they fail here)."""
        # one pass over the vocabulary: a finite sum means every logit of the row is finite (NaN and inf carry into
        # it); only a row whose sum is not (huge finite logits can overflow it) gets the exact check
        suspect = ~torch.isfinite(logits.sum(dim=-1))  # (B,)
        if bool(suspect.any()):
            finite = torch.isfinite(logits).all(dim=-1).tolist()
            for sequence, good in zip(sequences, finite, strict=True):
                if not good and not sequence.done:
                    self._fail(sequence, self._not_finite(sequence))
        return [row for row, sequence in enumerate(sequences) if not sequence.done]

    @staticmethod
    def _not_finite(sequence: SequenceState) -> str:
        """Why a row's logits are NaN or infinite, naming the likely cause and the way out."""
        request = sequence.request
        causes = []
        if request.steering:
            causes.append("its steering (a vector or scale too large; lower them)")
        if request.adapter is not None:
            causes.append(f"the adapter {request.adapter.name!r} (weights too large; check or retrain it)")
        cause = " or ".join(causes) or "the model's weights (check the checkpoint)"
        generated = sequence.generated
        where = "reading the prompt" if generated == 0 else f"after {generated} token{'s' * (generated > 1)}"
        return f"the model's logits are not finite (NaN or infinity) {where}: {cause} made its activations overflow"

    def _fail(self, sequence: SequenceState, reason: str) -> None:
        """End one sequence with SequenceFailed (its row is zeroed and freed at `release`)."""
        logger.warning("a sequence failed alone (its request gets the error): %s", reason)
        finish(sequence, error=SequenceFailed(reason))

    # ------------------------------------------------------------------------------------ scores
    def _score(self, prompt: Sequence[int], logits: torch.Tensor, start: int, top: int) -> list[TokenLogprob | None]:
        """The log-probabilities of the prompt tokens that the logits (T, V) of positions [start, start + T)
        predict, each given the tokens before it: row t scores token start + t + 1 (the first token, which nothing
        predicts, gets None; the last position predicts past the prompt)."""
        logprobs = F.log_softmax(self._limit(logits.float()), dim=-1)  # (T, V)
        scored: list[TokenLogprob | None] = [None] if start == 0 else []
        for row, token in enumerate(prompt[start + 1 : start + 1 + len(logprobs)]):
            scored.append(token_logprob(logprobs[row], token, top))
        return scored

    def _limit(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits with the ids the tokenizer lacks (a padded vocabulary) at -inf, in place."""
        if self.vocab_limit < self.vocab_size:
            logits[..., self.vocab_limit :] = float("-inf")
        return logits

    # ------------------------------------------------------------------------------------ leaving
    def release(self) -> None:
        """Finished sequences leave the batch (their rows are free for the next admissions)."""
        if self.prefilling is not None and self.prefilling.done:
            self.prefilling.prefill = None
            self.prefilling = None
        row = len(self.rows) - 1
        while row >= 0:  # from the end: a row leaving moves the last one into its place
            sequence = self.rows[row]
            if sequence.done:
                moved = self.batch.leave(row, scrub=sequence.status is SequenceStatus.FAILED)
                self.rows[row] = self.rows[-1]
                self.rows.pop()
                if moved is not None:
                    self.rows[row].row = row
                sequence.row = None
            row -= 1

    def clear(self) -> None:
        """Every row and the part-way prompt go (after a failed step)."""
        for sequence in self.in_flight():
            sequence.row = None
            sequence.prefill = None
        self.rows.clear()
        self.batch.clear()
        self.prefilling = None
