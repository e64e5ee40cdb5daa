"""The scheduler: turns the queue and the turn's budget into a plan, as plain data (vLLM v1's scheduler output).

Each turn of the engine's loop:

1. admissions (`Scheduler.admit`), at most `prefill_chunk` prompt tokens: first the next chunk of the prompt that
   is part-way prefilled, if any; then waiting sequences, while rows are free, whose prompts fit what is left
   whole (counted at the tokens they feed: a prompt's length less the prefix the prefix cache holds of it); then,
   when no prompt is part-way, the next one, with what is left as its first chunk (chunked prefill, as vLLM's
   token budget per step and llama-server's batch size bound theirs). So a decode step waits for one chunk's
   prefill at most, however long the prompts that arrive.
2. the decode plan (`Scheduler.decode`): whether the running rows step this turn, and which of them take a
   speculative step instead of a plain one. When no row was decoding before the turn, rows are free and more
   sequences wait, the step is held for a turn so the next admissions come first (a burst of requests gets its
   first tokens without decode steps in between); a row that was decoding never waits more than one turn's
   prefill.

Speculation is a property of a row (`SequenceState.speculative`: greedy, no rules, no log-probabilities;
gpt2.inference.speculative.speculates), as llama.cpp's server makes it one of a slot, and a row's tokens never
depend on it: greedy speculation commits exactly what plain greedy decoding draws. A verification feeds one row
several tokens (`DecodeBatch.extend`), which the batch runs for a lone row, so a speculative row speculates while
it decodes alone (no other row, no queue, no prompt part-way) and steps with the others otherwise; sampled rows
never speculate, so their draws are the same alone and under load.

Nothing here touches a model: the policy is tested on plain data (tests/test_scheduler.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")


@dataclass(frozen=True)
class Admissions(Generic[S]):
    """What a turn takes from the queue."""

    whole: list[S]
    """Prompts prefilled whole this turn (or none to prefill: nothing to generate)."""
    chunked: S | None = None
    """A prompt to prefill in chunks, starting this turn."""
    first_chunk: int = 0
    """Its first chunk at most: what is left of the turn's budget."""
    part_way_chunk: int = 0
    """Tokens of the part-way prompt's next chunk, fed first (0: none part-way)."""


@dataclass(frozen=True)
class DecodePlan:
    """Who decodes this turn."""

    step: bool
    """Whether the running rows take a decode step."""
    speculating: tuple[int, ...] = ()
    """Rows that take a speculative step instead of a plain one."""


@dataclass(frozen=True)
class Scheduler:
    """The policy of the module docstring for a batch of `max_rows` rows and a budget of `prefill_chunk` prompt
    tokens a turn."""

    max_rows: int
    prefill_chunk: int

    def admit(
        self, waiting: deque[S], *, cost: Callable[[S], int], active: int, part_way_remaining: int | None
    ) -> Admissions[S]:
        """Take the sequences a turn admits off the front of `waiting` (`cost`: the prompt tokens one feeds).
        `active`: rows held (decoding, or prefilling in chunks); `part_way_remaining`: the tokens the part-way
        prompt has left, None when there is none."""
        budget = self.prefill_chunk
        part_way_chunk = 0
        if part_way_remaining is not None:
            part_way_chunk = min(budget, part_way_remaining)  # its next chunk goes first
            budget -= part_way_chunk
        free = self.max_rows - active
        whole: list[S] = []
        chunked = None
        while waiting and len(whole) < free:
            sequence = waiting[0]
            sequence_cost = cost(sequence)
            if sequence_cost <= budget:
                whole.append(sequence)
                budget -= sequence_cost
            elif part_way_remaining is None and budget > 0:
                chunked = sequence  # the rest of the budget is its first chunk
            else:
                break
            waiting.popleft()
            if chunked is not None:
                break
        return Admissions(whole, chunked, budget if chunked is not None else 0, part_way_chunk)

    def decode(
        self, speculative: Sequence[bool], *, running_before: int, admitted: bool, waiting: int, part_way: bool
    ) -> DecodePlan:
        """The decode plan for rows whose `speculative` flags are given (one per row, after the turn's
        admissions): `running_before` rows decoded before the turn, `admitted` whether it admitted any,
        `waiting` sequences are queued, `part_way` whether a prompt is part-way prefilled."""
        rows = len(speculative)
        hold = running_before == 0 and admitted and waiting > 0 and rows + part_way < self.max_rows
        if rows == 0 or hold:
            return DecodePlan(step=False)
        alone = rows == 1 and waiting == 0 and not part_way
        return DecodePlan(step=True, speculating=(0,) if alone and speculative[0] else ())
